"""Probe: batched copies between host arrays and separately allocated device tensors,
with the large pageable pieces in one pipeline (``_batch._set_scattered_pipeline(True)``,
the default) or each through its own copy (False), in turns (15 rounds, median; x line).

    python bench/probe_scattered.py [DIR] [OUTFILE]     (default DIR: /dev/shm)

Cases: the tensors of all-MiniLM-L6-v2 (104 fp32, 91 MB) and Qwen2.5-0.5B (290 bf16,
0.99 GB) shaped checkpoints, read into host memory: h2d_copy into tensors allocated one
by one on cuda:0 (reloading weights into a model that exists), and d2h_copy from those
back into the host arrays (pageable).
"""
import sys

import numpy as np
from _timing import (host_tensors, in_turns, layout_files, pinned_line_gbps, say, turns_row,
                     write_log)

import etptr
from etptr.cuda import _batch


def main(argv):
    root = argv[1] if len(argv) > 1 else "/dev/shm"
    line = pinned_line_gbps()
    say(f"line (pinned 256 MiB): {line:.1f} GB/s")
    say("case: us per call (x line), one pipeline | each piece alone")
    for name, path in layout_files(root, ("all-minilm-l6-v2", "qwen2.5-0.5b")):
        arrays, srcs = host_tensors(path)
        path.unlink()                                    # (the arrays are in memory)
        outs = [etptr.clone_tensor_ptr_to(t, "cuda:0") for t in srcs]   # one by one
        nbytes = sum(a.nbytes for a in arrays)
        back = [etptr.make_tensor_ptr(np.zeros_like(a)) for a in arrays]
        for what, fn in (("h2d_copy", lambda: etptr.h2d_copy(srcs, outs)),
                         ("d2h_copy", lambda: etptr.d2h_copy(outs, back))):
            t = in_turns(fn, _batch._set_scattered_pipeline,
                         {"one pipeline": True, "alone": False}, True)
            say(f"  {name} {what} ({len(arrays)} tensors, {nbytes / 1e6:.1f} MB): " +
                turns_row(t, nbytes, line))
        assert all(np.array_equal(a.view(np.uint8), b.numpy().view(np.uint8))
                   for a, b in zip(arrays, back))
        del srcs, outs, back, arrays
    if len(argv) > 2:
        write_log(argv[2])


if __name__ == "__main__":
    main(sys.argv)
