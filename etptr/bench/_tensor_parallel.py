"""A tensor-parallel rank's share of a checkpoint, for ``etptr-bench --tp``.

Loaders that serve tensor-parallel inference read, on each of N ranks, that rank's slice
of every weight: the projections whose outputs are split (q, k, v, gate, up; the
embeddings and the head by vocabulary) by rows, the ones whose inputs are split (o, down)
by columns, and the small vectors (norms, biases of row-split layers) whole. Megatron's
split, which vLLM and SGLang follow for the Llama and Qwen families, is assumed from the
tensors' names (Hugging Face's); a tensor the rule does not name goes whole.

:func:`rank_requests` gives one rank's ``(name, index)`` list for
:meth:`etptr.safe_open`'s ``get_slices``; :func:`tp_cases` times every rank's share with
etptr (one batch per rank) and with the ``safetensors`` library's ``get_slice`` tensor by
tensor, beside the bytes a rank needs.
"""
from __future__ import annotations

import os
from typing import Any

import etptr
from etptr.bench._timing import Case
from etptr.checkpoint import read_plan

__all__ = ["ROW_SPLIT", "COLUMN_SPLIT", "rank_requests", "run_mode", "split_of", "tp_cases"]

#: Name parts of weights split by rows (their outputs): dim 0 of a [out, in] weight.
ROW_SPLIT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head",
             "query", "key", "value", "word_embeddings")
#: Name parts of weights split by columns (their inputs): dim 1.
COLUMN_SPLIT = ("o_proj", "down_proj", "dense")


def split_of(name: str, ndim: int) -> int | None:
    """The dim a tensor named ``name`` of ``ndim`` dims is split along across ranks, or
    None (taken whole)."""
    parts = name.split(".")
    if any(p in ROW_SPLIT for p in parts):
        return 0 if ndim >= 1 and (ndim >= 2 or name.endswith("bias")) else None
    if any(p in COLUMN_SPLIT for p in parts):
        return 1 if ndim == 2 else None
    return None


def rank_requests(shapes: dict[str, tuple[int, ...]], rank: int,
                  world: int) -> list[tuple[str, Any]]:
    """``(name, index)`` of rank ``rank`` of ``world`` for every tensor of ``shapes``: an
    even share of the split dim (the last rank takes what does not divide), or ``...``."""
    out: list[tuple[str, Any]] = []
    for name, shape in shapes.items():
        dim = split_of(name, len(shape))
        if dim is None or dim >= len(shape):
            out.append((name, ...))
            continue
        size = shape[dim]
        per = size // world
        start = rank * per
        stop = size if rank == world - 1 else start + per
        index = [slice(None)] * len(shape)
        index[dim] = slice(start, stop)
        out.append((name, tuple(index)))
    return out


def _shapes(paths: list[str]) -> dict[str, tuple[int, ...]]:
    plan = read_plan(paths if len(paths) > 1 else paths[0])
    return {t.name: t.shape for _, t in plan.entries()}


def tp_cases(paths: list[str], device: str, worlds: tuple[int, ...] = (2, 4, 8),
             sync: Any = None, framework: str = "etptr") -> list[Case]:
    """One case per world size and loader: every rank's share read in turn (the bytes
    are those the ranks need, about the checkpoint's size over all ranks). etptr reads a
    rank's share as one batch (``get_slices``: one copy per file); the ``safetensors``
    library slices tensor by tensor (``get_slice``), on the CPU then moved to ``device``."""
    shapes = _shapes(paths)
    source = paths if len(paths) > 1 else paths[0]
    cases = []
    for world in worlds:
        ranks = [rank_requests(shapes, r, world) for r in range(world)]
        with etptr.safe_open(source) as f:
            nbytes = sum(t.nbytes for reqs in ranks for t in f.get_slices(reqs))
        per_rank = nbytes // world

        def etptr_ranks(ranks: list = ranks) -> list:
            with etptr.safe_open(source, framework=framework, device=device) as f:
                return [f.get_slices(reqs) for reqs in ranks]

        cases.append(Case(f"tp{world}.etptr", f"etptr get_slices, {world} ranks "
                          f"({per_rank / 1e9:.2f} GB a rank)", etptr_ranks, nbytes=nbytes,
                          count=world, sync=sync))
        peer = _safetensors_ranks(paths, ranks, device)
        if peer is not None:
            cases.append(Case(f"tp{world}.safetensors", f"safetensors get_slice per tensor"
                              f"{' (+ a copy)' if device == 'cpu' else ''}, {world} ranks",
                              peer, nbytes=nbytes, count=world, sync=sync))
    return cases


def _safetensors_ranks(paths: list[str], ranks: list, device: str) -> Any:
    """The safetensors library's way: ``get_slice`` per tensor (torch), then ``.to``
    the device; None without torch (the library's NumPy framework has no bfloat16)."""
    try:
        import torch
    except ImportError:
        return None
    from safetensors import safe_open

    from etptr.checkpoint import parse_header
    where = {t.name: p for p in paths for t in parse_header(p).tensors}

    def take(t: Any) -> Any:
        # on the CPU the library's slices are views of its map of the file: a copy
        # gives memory of their own, as etptr's (and as .to(device) does on a GPU)
        return t.to(device) if device != "cpu" else t.clone(memory_format=torch.contiguous_format)

    def run() -> list:
        out = []
        handles = {p: safe_open(p, framework="pt") for p in set(where.values())}
        for reqs in ranks:
            out.append([take(handles[where[name]].get_slice(name)[index])
                        for name, index in reqs])
        return out
    return run


def run_mode(args: Any, env: Any, out: Any, paths: list) -> tuple[int, dict]:
    """``etptr-bench --tp``: every rank's share for each world size of ``args.tp``, with
    etptr and the safetensors library, page cache warm; checks etptr's slices against the
    library's for the largest world; prints the table, returns ``(status, report)``."""
    from etptr.bench._checkpoint import resolve
    from etptr.bench._file_io import warm
    from etptr.bench._report import fmt_gbps, fmt_ratio, fmt_size, ratio, table
    from etptr.bench._timing import run_cases

    files = [str(f.path) for f in resolve(paths)]
    device = env.device if env.available and env.etptr_ok else "cpu"
    sync = env.sync if device != "cpu" else None
    warm(files)
    worlds = tuple(args.tp)
    out(f"tensor-parallel shares: {len(files)} file(s), "
        f"{fmt_size(sum(os.path.getsize(f) for f in files))}, ranks {worlds} -> {device} "
        f"(page cache warm)")
    with env.context():
        cases = tp_cases(files, device, worlds, sync=sync)
        timings = run_cases(cases, repeats=args.repeats, warmup=args.warmup,
                            progress=not args.no_progress)
        differ = _check(files, device, max(worlds))
    rows, ratios = [], {}
    for world in worlds:
        mine, peer = timings.get(f"tp{world}.etptr"), timings.get(f"tp{world}.safetensors")
        g_mine = mine.gbps(args.stat) if mine else None
        g_peer = peer.gbps(args.stat) if peer else None
        ratios[world] = ratio(g_mine, g_peer)
        rows.append([str(world), fmt_size(mine.nbytes // world) if mine else "-",
                     fmt_gbps(g_mine), fmt_gbps(g_peer), fmt_ratio(ratios[world])])
    out("")
    out(table(["ranks", "bytes a rank", "etptr get_slices GB/s",
               "safetensors get_slice GB/s", "etptr / safetensors"], rows))
    out("  every rank's share read in turn, by one process; GB/s of the bytes the ranks need"
        + ("; on the CPU the library's slices are views of its map of the file, each copied "
           "to memory of its own here (as .to(device) does on a GPU)" if device == "cpu" else ""))
    if differ is None:
        out("slices not checked: torch is needed for the safetensors library's bfloat16")
    else:
        out(f"slices of {max(worlds)} ranks: "
            + (f"{len(differ)} differ from the safetensors library's: {', '.join(differ[:5])}"
               if differ else "all bit-identical to the safetensors library's"))
    report = {"files": files, "device": device, "worlds": list(worlds), "ratios": ratios,
              "mismatches": differ,
              "timings": {k: t.as_dict() for k, t in timings.items()}}
    return (1 if differ else 0), report


def _check(files: list[str], device: str, world: int) -> list[str] | None:
    """Names whose slices etptr reads differently from the safetensors library, for every
    rank of ``world``; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    from safetensors import safe_open

    from etptr.checkpoint import parse_header
    shapes = _shapes(files)
    where = {t.name: p for p in files for t in parse_header(p).tensors}
    source = files if len(files) > 1 else files[0]
    differ = set()
    with etptr.safe_open(source, framework="pt", device=device) as f:
        for rank in range(world):
            reqs = rank_requests(shapes, rank, world)
            for (name, index), got in zip(reqs, f.get_slices(reqs)):
                with safe_open(where[name], framework="pt") as ref:
                    want = ref.get_slice(name)[index]
                if not torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)):
                    differ.add(name)
    return sorted(differ)
