"""Probe: the upload pipeline's ring of pinned slots, small enough to stay in the CPU's caches?

    python bench/probe_ring.py [DIR] [OUTFILE]     (default DIR: /dev/shm)

Beside a DMA the slots' fills slow to 45-51 GB/s (bench/results/h200_probe_fill.txt),
which bounds a 91 MB upload at about 0.85 of the line. A slot filled with ordinary
stores may still be in the cache when its DMA reads it, so a small ring could take
the slots' traffic off the memory bus. Each case runs under rings of S MiB x K
slots, filled with memcpy (the default above 64 MiB) or with non-temporal stores,
in turns (15 rounds, median; x line in brackets): a batched clone of an
all-MiniLM-L6-v2-shaped set of host tensors (104 fp32, 91 MB), one 91 MB and one
256 MiB h2d_copy, load_safetensors of the MiniLM checkpoint from DIR, and a batched
clone of a Qwen2.5-0.5B-shaped set (290 bf16, 0.99 GB).
"""
import sys

import numpy as np
from _timing import (host_tensors, in_turns, layout_files, pinned_line_gbps, say, turns_row,
                     write_log)

import etptr
import etptr.cuda
from etptr.cuda import _copy_engine

MiB = 1 << 20
NT = 1 << 40          # streaming-store limit: every upload from memory
# mode: (slot bytes, slots, streaming-store limit)
RINGS = {
    "S16 K3 (default)": (16 * MiB, 3, None),
    "S16 K3 nt": (16 * MiB, 3, NT),
    "S8 K6": (8 * MiB, 6, None),
    "S4 K6": (4 * MiB, 6, None),
    "S4 K12": (4 * MiB, 12, None),
    "S2 K12": (2 * MiB, 12, None),
    "S2 K24": (2 * MiB, 24, None),
    "S2 K24 nt": (2 * MiB, 24, NT),
    "S1 K32": (MiB, 32, None),
}


def cases(path, small):
    arrays, tensors = host_tensors(path)
    nbytes = sum(a.nbytes for a in arrays)
    table = {"clone_tensor_ptrs_to": (nbytes, lambda: etptr.clone_tensor_ptrs_to(tensors,
                                                                                 "cuda:0"))}
    if small:
        flat = etptr.make_tensor_ptr(np.concatenate([a.view(np.uint8).reshape(-1)
                                                     for a in arrays]))
        flat_out = etptr.clone_tensor_ptr_to(flat, "cuda:0")
        big = etptr.make_tensor_ptr(np.ones(256 * MiB, np.uint8))
        big_out = etptr.clone_tensor_ptr_to(big, "cuda:0")
        table["h2d_copy 91 MB"] = (nbytes, lambda: etptr.h2d_copy(flat, flat_out))
        table["h2d_copy 256 MiB"] = (256 * MiB, lambda: etptr.h2d_copy(big, big_out))
        table["load_safetensors"] = (nbytes, lambda: etptr.load_safetensors(
            path, "cuda:0", progress=False))
    return table


def main(argv):
    root = argv[1] if len(argv) > 1 else "/dev/shm"
    line = pinned_line_gbps()
    default_max = _copy_engine._get_streaming_max()
    say(f"line (pinned 256 MiB): {line:.1f} GB/s; config {etptr.cuda.get_copy_config()}; "
        f"streaming stores up to {default_max >> 20} MiB ('nt': for every upload)")

    keys = []

    def knob(v):
        if v is None:
            _copy_engine._pop_config(keys.pop())
            _copy_engine._set_streaming_max(default_max)
            return
        keys.append(_copy_engine._push_config(slot_bytes=v[0], slots=v[1]))
        _copy_engine._set_streaming_max(default_max if v[2] is None else v[2])

    # in_turns sets each mode, then the default: here None pops the mode's settings
    say("case: us per call (x line) for " + " | ".join(RINGS))
    for name, path in layout_files(root, ("all-minilm-l6-v2", "qwen2.5-0.5b")):
        for case, (nbytes, fn) in cases(path, name == "all-minilm-l6-v2").items():
            t = in_turns(fn, knob, RINGS, None)
            say(f"  {name} {case} ({nbytes / 1e6:.1f} MB): " + turns_row(t, nbytes, line))
    if len(argv) > 2:
        write_log(argv[2])


if __name__ == "__main__":
    main(sys.argv)
