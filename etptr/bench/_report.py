"""Formatting for ``etptr-bench``: sizes, rates, ratios and plain-text tables."""
from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {"": 1, "b": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes from ``"4KiB"``, ``"16MiB"``, ``"1GiB"`` or a plain byte count (binary units).

    Raises
    ------
    ValueError
        Unknown unit, or a size below one byte.
    """
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r}: expected a number with B, KiB, MiB or GiB")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 1:
        raise ValueError(f"size {text!r} is below one byte")
    return value


def fmt_size(nbytes: int) -> str:
    """``"4 KiB"``, ``"86.6 MiB"``, ``"1 GiB"``: binary units, one decimal unless whole."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if nbytes % scale == 0 else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def fmt_size_short(nbytes: int) -> str:
    """Axis label for a power-of-two size: ``"4K"``, ``"16M"``, ``"1G"``."""
    for unit, scale in (("G", GiB), ("M", MiB), ("K", KiB)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:g}{unit}"
    return f"{nbytes}B"


def fmt_gbps(value) -> str:
    """GB/s with one decimal; below 0.1 GB/s in MB/s with its unit (a tiny checkpoint's
    rate is not "0.0"); ``"-"`` when not measured."""
    if value is None:
        return "-"
    if value < 0.1:
        return f"{value * 1000:.1f} MB/s"
    return f"{value:.1f}"


def fmt_ratio(value) -> str:
    """A ratio with two decimals, ``"-"`` when either side was not measured."""
    return "-" if value is None else f"{value:.2f}"


def ratio(num, den):
    """``num / den``, or None when either is missing or ``den`` is zero."""
    if num is None or den is None or den == 0:
        return None
    return num / den


def table(headers, rows, indent: int = 2) -> str:
    """A plain-text table: the first header is a title at the margin, row labels are
    indented by ``indent`` under it, the other columns are right-aligned."""
    rows = [[" " * indent + str(r[0])] + [str(c) for c in r[1:]] for r in rows]
    headers = [str(h) for h in headers]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        parts = [cells[0].ljust(widths[0])]
        parts += [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in rows])
