"""Probe: where the time of ``load_safetensors(path, "cuda:0")`` goes, step by step,
beside batched copies of the same bytes from a map already faulted in and from a
fresh one. Writes a checkpoint of a named layout's shapes (Qwen2.5-0.5B's by default)
to DIR first (its pages stay in the page cache: /dev/shm is tmpfs; a directory on a
disk's file system shows how that file system's page cache is read).

    python bench/tools/probe_load.py [LAYOUT [DIR]]      (default: qwen2.5-0.5b /dev/shm)
"""
import os
import shutil
import sys
import tempfile


import etptr
from etptr import DeviceMemoryBuffer
from etptr.bench._model_shapes import write_layout
from etptr.checkpoint._file import map_file
from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
from etptr.checkpoint._plan import read_plan

from _probes import conditions, file_uploader, median_seconds, pinned_line_gbps


def med(f):
    """Seconds of ``f`` (a call that is complete on return), median of 7 after 1."""
    return median_seconds(f, 7, warmup=1)


def main(name, where):
    d = tempfile.mkdtemp(dir=where)
    path = write_layout(name, d)
    plan = read_plan(path)
    f = plan.files[0]
    lay = layout_file(f, DEVICE_ALIGNMENT)
    n = plan.nbytes
    dev = "cuda:0"
    fs = os.popen(f"stat -f -c %T {d}").read().strip()
    print(f"{path} ({fs}): {len(f.tensors)} tensors, {n / 1e9:.3f} GB, {len(lay.runs)} copy runs")
    print(conditions())

    def gbps(s):
        return f"{s * 1e3:8.2f} ms  {n / s / 1e9:6.1f} GB/s"

    print("load_safetensors        ", gbps(med(lambda: etptr.load_safetensors(path, "cuda:0",
                                                                             progress=False))))
    print("  read_plan             ", gbps(med(lambda: read_plan(path))))
    print("  layout_file           ", gbps(med(lambda: layout_file(f, DEVICE_ALIGNMENT))))
    print("  map_file + close      ", gbps(med(lambda: map_file(f).release())))
    buf = DeviceMemoryBuffer.create(lay.nbytes, dev, alignment=DEVICE_ALIGNMENT)
    print("  DeviceMemoryBuffer    ", gbps(med(lambda: DeviceMemoryBuffer.create(
        lay.nbytes, dev, alignment=DEVICE_ALIGNMENT).close())))
    outs = [buf.tensor(r.buffer_offset, [r.nbytes], etptr.ScalarType.Byte) for r in lay.runs]
    print("  views                 ", gbps(med(lambda: buf._views(
        lay.offsets, [t.shape for t in f.tensors], [t.scalar_type for t in f.tensors]))))
    print("  upload (pread)        ", gbps(med(file_uploader(f, buf))))

    def copy_fresh():
        m = map_file(f)
        srcs = [etptr.make_tensor_ptr([r.nbytes], m[r.file_offset:r.file_offset + r.nbytes],
                                      type=etptr.ScalarType.Byte) for r in lay.runs]
        etptr.h2d_copy(srcs, outs)
        del srcs

    print("  h2d_copy, fresh map   ", gbps(med(copy_fresh)))
    m = map_file(f)
    srcs = [etptr.make_tensor_ptr([r.nbytes], m[r.file_offset:r.file_offset + r.nbytes],
                                  type=etptr.ScalarType.Byte) for r in lay.runs]
    etptr.h2d_copy(srcs, outs)
    print("  h2d_copy, faulted map ", gbps(med(lambda: etptr.h2d_copy(srcs, outs))))
    print("  clone_tensor_ptrs_to, faulted map",
          gbps(med(lambda: etptr.clone_tensor_ptrs_to(srcs, "cuda:0"))))
    print(f"  line (pinned 256 MiB)  {pinned_line_gbps(reps=7, warmup=1):6.1f} GB/s")
    srcs = m = None
    shutil.rmtree(d)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b",
         sys.argv[2] if len(sys.argv) > 2 else "/dev/shm")
