"""Probe: does ending uploads with halving chunks (``_copy_engine._set_ramp_down``) pay?

    python bench/probe_ramp_down.py [DIR] [OUTFILE]     (default DIR: /dev/shm)

The last DMA of a pipelined upload runs after every fill is done; halving the last
chunks shortens it, at the price of a few more chunks. Each case runs with the
ramp-down off and at 1, 2 and 4 MiB, in turns (15 rounds, median; x line in
brackets): a batched clone and a batched h2d_copy of an all-MiniLM-L6-v2-shaped set
of host tensors (104 fp32, 91 MB), one 91 MB h2d_copy, load_safetensors of that
checkpoint and of a Qwen2.5-0.5B-shaped one (0.99 GB) from DIR, and a batched clone
of the 0.5B's tensors from memory. Then the MiniLM cases with other ramp-ups (the first
chunk's size and growth, ``_copy_engine._set_ramp_up``), the same way.
"""
import sys

import numpy as np
from _timing import (host_tensors, in_turns, layout_files, pinned_line_gbps, say, turns_row,
                     write_log)

import etptr
from etptr.cuda import _copy_engine

MiB = 1 << 20
MODES = {"off": 0, "1 MiB": MiB, "2 MiB": 2 * MiB, "4 MiB": 4 * MiB}
RAMP_UPS = {"8/150 (default)": (8 * MiB, 150), "whole slots": (0, 150), "4/150": (4 * MiB, 150),
            "2/200": (2 * MiB, 200), "1/200": (MiB, 200)}


def cases(path):
    arrays, tensors = host_tensors(path)
    nbytes = sum(a.nbytes for a in arrays)
    outs = etptr.clone_tensor_ptrs_to(tensors, "cuda:0")
    flat = np.concatenate([a.view(np.uint8).reshape(-1) for a in arrays])
    one = etptr.make_tensor_ptr(flat)
    one_out = etptr.clone_tensor_ptr_to(one, "cuda:0")
    return nbytes, {
        "clone_tensor_ptrs_to": lambda: etptr.clone_tensor_ptrs_to(tensors, "cuda:0"),
        "h2d_copy (batch)": lambda: etptr.h2d_copy(tensors, outs),
        "h2d_copy (one tensor)": lambda: etptr.h2d_copy(one, one_out),
        "load_safetensors": lambda: etptr.load_safetensors(path, "cuda:0", progress=False),
    }


def ramp_ups(table, nbytes, line):
    default = _copy_engine._get_ramp_up()
    say("  first chunk MiB / growth %: " + " | ".join(RAMP_UPS))

    def knob(v):
        _copy_engine._set_ramp_up(v[0], v[1], default[2])

    for case in ("clone_tensor_ptrs_to", "h2d_copy (one tensor)", "load_safetensors"):
        t = in_turns(table[case], knob, RAMP_UPS, default[:2])
        say(f"    {case}: " + turns_row(t, nbytes, line))


def main(argv):
    root = argv[1] if len(argv) > 1 else "/dev/shm"
    line = pinned_line_gbps()
    say(f"line (pinned 256 MiB): {line:.1f} GB/s")
    say(f"ramp-down default: {_copy_engine._get_ramp_down()} bytes; ramp-up "
        f"{_copy_engine._get_ramp_up()}")
    say("case: us per call (x line) for ramp-down " + " | ".join(MODES))
    only = {"qwen2.5-0.5b": ("clone_tensor_ptrs_to", "load_safetensors")}
    for name, path in layout_files(root, ("all-minilm-l6-v2", "qwen2.5-0.5b")):
        nbytes, table = cases(path)
        for case, fn in table.items():
            if name in only and case not in only[name]:
                continue
            t = in_turns(fn, _copy_engine._set_ramp_down, MODES, _copy_engine._get_ramp_down())
            say(f"  {name} {case} ({nbytes / 1e6:.1f} MB): " + turns_row(t, nbytes, line))
        if name not in only:
            ramp_ups(table, nbytes, line)
    if len(argv) > 2:
        write_log(argv[2])


if __name__ == "__main__":
    main(sys.argv)
