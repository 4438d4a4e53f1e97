"""``etptr-bench --sweep``: GB/s against transfer size, as tables and a PNG plot."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from etptr.bench import _cpu, _cuda
from etptr.bench._report import GiB, KiB, MiB, fmt_gbps, fmt_ratio, fmt_size, ratio, table
from etptr.bench._timing import run_cases

MIN_SIZE = 4 * KiB
MAX_SIZE = 1 * GiB
QUICK_SIZES = (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB)
# one sample covers at least this many bytes (small sizes repeat the call) ...
SAMPLE_BYTES = 1 * MiB
MAX_NUMBER = 64
# ... and sizes above this get fewer repeats (at least 3)
FULL_REPEATS_UP_TO = 64 * MiB


def sweep_sizes(quick: bool, max_size: int = MAX_SIZE) -> list:
    """Transfer sizes in bytes: powers of two from 4 KiB to ``max_size`` (at most 1 GiB),
    or six points (4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, 1 GiB) with ``quick``."""
    top = min(max_size, MAX_SIZE)
    if quick:
        sizes = [n for n in QUICK_SIZES if n <= top]
    else:
        sizes, n = [], MIN_SIZE
        while n <= top:
            sizes.append(n)
            n *= 2
    return sizes or [min(top, MIN_SIZE)]


def number_for(nbytes: int) -> int:
    """Calls per timed sample: enough for about 1 MiB, at most 64."""
    return max(1, min(MAX_NUMBER, SAMPLE_BYTES // nbytes))


def repeats_for(repeats: int):
    """Repeats per size: ``repeats`` up to 64 MiB, scaled down above (never below 3)."""
    def for_size(nbytes: int) -> int:
        if nbytes <= FULL_REPEATS_UP_TO:
            return repeats
        return max(min(3, repeats), repeats * FULL_REPEATS_UP_TO // nbytes)
    return for_size


def pattern(nbytes: int) -> np.ndarray:
    """A pageable uint8 array of ``nbytes`` with every page written (a counting pattern)."""
    words = np.arange((nbytes + 7) // 8, dtype=np.uint64)
    words *= np.uint64(0x9E3779B97F4A7C15)  # spread the counter over all bytes
    return words.view(np.uint8)[:nbytes]


@dataclass
class SweepResult:
    """GB/s per series and size.

    Attributes
    ----------
    sizes : list of int, bytes
    series : dict
        Series key -> label, in display order.
    timings : dict
        Series key -> list of Timing, one per size.
    round_trip_bad : list of int or None
        Sizes whose round trip was not bit-identical; None when not checked.
    mode : str
        ``"cuda"`` or ``"host"``.
    """

    sizes: list
    series: dict
    timings: dict = field(default_factory=dict)
    round_trip_bad: object = None
    mode: str = "host"
    device: str = ""

    def gbps(self, key: str, stat: str) -> list:
        if key not in self.timings:
            return [None] * len(self.sizes)
        return [t.gbps(stat) for t in self.timings[key]]


def run_sweep(env, sizes, *, repeats: int, warmup: int, progress: bool) -> SweepResult:
    """Measure every available path at every size (GPU paths with CUDA, host copies without)."""
    host = pattern(max(sizes))
    rep = repeats_for(repeats)
    if env.available:
        with env.context():
            prep = _cuda.sweep_cases(env, host, sizes, number_for, rep)
            try:
                timings = run_cases(prep.cases, repeats=repeats, warmup=warmup,
                                    progress=progress, desc="etptr-bench sweep")
            finally:
                prep.close()
        result = SweepResult(sizes, prep.series, round_trip_bad=prep.round_trip_bad,
                             mode="cuda", device=f"{env.device} ({env.name})")
    else:
        series, cases = _cpu.sweep_cases(host, sizes, number_for, rep)
        bad = _cpu.sweep_check(host, sizes)
        timings = run_cases(cases, repeats=repeats, warmup=warmup, progress=progress,
                            desc="etptr-bench sweep")
        result = SweepResult(sizes, series, round_trip_bad=bad, mode="host", device="host")
    for key in result.series:
        result.timings[key] = [timings[f"{key}@{n}"] for n in sizes]
    return result


# (title, GB/s columns, (etptr series, [(peer series, ratio header)]), a second ratio group or None)
_CUDA_TABLES = (
    ("H2D", ("etptr.h2d", "etptr.h2d_pinned", "cupy.h2d", "torch.h2d", "torch.h2d_pinned",
             "line.h2d"),
     ("etptr.h2d", [("line.h2d", "etptr/line"), ("cupy.h2d", "etptr/cupy"),
                    ("torch.h2d", "etptr/torch")]),
     ("etptr.h2d_pinned", [("line.h2d", "etptr pinned/line")])),
    ("D2H", ("etptr.d2h", "cupy.d2h", "torch.d2h", "torch.d2h_pinned", "line.d2h"),
     ("etptr.d2h", [("line.d2h", "etptr/line"), ("cupy.d2h", "etptr/cupy"),
                    ("torch.d2h", "etptr/torch")]),
     None),
)

_SHORT = {
    "etptr.h2d": "etptr", "etptr.h2d_pinned": "etptr pinned", "etptr.d2h": "etptr",
    "cupy.h2d": "cupy", "cupy.d2h": "cupy get", "torch.h2d": "torch", "torch.d2h": "torch",
    "torch.h2d_pinned": "torch pinned", "torch.d2h_pinned": "torch pinned",
    "line.h2d": "line", "line.d2h": "line",
    "host.clone": "clone_tensor_ptr", "host.numpy_copy": "ndarray.copy()",
}


def _ratio_columns(result, stat, base, peers):
    cols = []
    for peer, header in peers:
        if base in result.series and peer in result.series:
            num, den = result.gbps(base, stat), result.gbps(peer, stat)
            cols.append((header, [fmt_ratio(ratio(a, b)) for a, b in zip(num, den, strict=True)]))
    return cols


def format_sweep(result: SweepResult, stat: str) -> str:
    """The sweep as text: one table per direction, GB/s with ratios."""
    blocks = []
    if result.mode == "cuda":
        specs = [(title, keys, ratios, extra) for title, keys, ratios, extra in _CUDA_TABLES]
    else:
        specs = [("host copies", ("host.clone", "host.numpy_copy"),
                  ("host.clone", [("host.numpy_copy", "etptr/numpy")]), None)]
    for title, keys, (base, peers), extra in specs:
        present = [k for k in keys if k in result.series]
        cols = [(_SHORT[k], [fmt_gbps(v) for v in result.gbps(k, stat)]) for k in present]
        cols += _ratio_columns(result, stat, base, peers)
        if extra:
            cols += _ratio_columns(result, stat, extra[0], extra[1])
        headers = [f"{title} (GB/s)"] + [h for h, _ in cols]
        rows = [[fmt_size(n)] + [c[i] for _, c in cols] for i, n in enumerate(result.sizes)]
        blocks.append(table(headers, rows))
    return "\n\n".join(blocks)


def plot_sweep(result: SweepResult, path, stat: str) -> None:
    """Write a PNG of GB/s against transfer size (log2 x axis) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from etptr.bench._report import fmt_size_short

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    try:
        for key, label in result.series.items():
            ys = [np.nan if v is None else v for v in result.gbps(key, stat)]
            down = "d2h" in key
            style = {"linestyle": ":" if down else "-"}
            if key.startswith("line."):
                style.update(color="black", linestyle="-." if down else "--")
            if key.startswith("etptr") or key == "host.clone":
                style.update(linewidth=2.2)
            ax.plot(result.sizes, ys, marker="o", markersize=3, label=label, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(result.sizes)
        ax.set_xticklabels([fmt_size_short(n) for n in result.sizes], rotation=45)
        ax.minorticks_off()
        ax.set_xlabel("transfer size (bytes, binary units)")
        ax.set_ylabel(f"GB/s (1e9 bytes/s, {stat} of repeats)")
        ax.set_ylim(bottom=0)
        where = result.device if result.mode == "cuda" else "the host (no CUDA)"
        ax.set_title(f"etptr-bench sweep on {where}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
