"""Helpers shared by the tools in bench/tools/ (run as ``python bench/tools/<script>.py``,
which puts this folder on the import path): a log that is printed as it goes and kept
for an output file, median wall times, the pinned line rate, the settings a measurement
ran under, a checkpoint file's upload alone, checkpoint files of model layouts in a
scratch directory, a checkpoint's tensors read into host memory, and timings of one call
under several settings in turns."""
import shutil
import statistics
import tempfile
import time

LINES = []


def say(*parts):
    """Print ``parts`` as one line and keep it in LINES."""
    line = " ".join(str(p) for p in parts)
    LINES.append(line)
    print(line, flush=True)


def median_seconds(fn, reps, warmup=1):
    """Median wall time of ``reps`` calls of ``fn()`` after ``warmup`` untimed ones (s)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gbps(fn, nbytes, reps=9, warmup=2):
    """GB/s of ``fn`` (a call that is complete on return) moving ``nbytes``: the median
    of ``reps`` calls after ``warmup`` untimed ones."""
    return nbytes / median_seconds(fn, reps, warmup) / 1e9


def pinned_line_gbps(reps=9, warmup=2):
    """The pinned line rate: GB/s of one 256 MiB cudaMemcpyAsync from page-locked memory
    to cuda:0 (CuPy), as :func:`gbps` times it."""
    import cupy
    n = 256 << 20
    host = cupy.cuda.alloc_pinned_memory(n)
    dev = cupy.cuda.alloc(n)
    return gbps(lambda: (dev.copy_from_host_async(host.ptr, n),
                         cupy.cuda.Device(0).synchronize()), n, reps, warmup)


def write_log(path):
    """Write every line said so far to ``path``."""
    with open(path, "w") as f:
        f.write("\n".join(LINES) + "\n")


def file_uploader(plan, buf):
    """A call that uploads the file of ``plan`` (a FilePlan) into the DeviceMemoryBuffer
    ``buf`` laid out as the loader lays it out, as ``load_safetensors`` does it (the
    copy threads read the file into the pinned slots), with nothing else of a load."""
    import etptr
    from etptr.checkpoint._file import open_checked
    from etptr.checkpoint._layout import DEVICE_ALIGNMENT, layout_file
    alloc = etptr.get_device_allocator(etptr.DeviceType.CUDA)
    pieces = [(r.file_offset, r.buffer_offset, r.nbytes)
              for r in layout_file(plan, DEVICE_ALIGNMENT).runs]

    def upload():
        with open_checked(plan) as f:
            alloc.copy_file_to_device(buf.data_ptr, f.fileno(), pieces, buf.device.index)

    return upload


def conditions():
    """One line naming what a measurement ran under: the copy configuration and the copy
    engine's tuning (``etptr.cuda._tuning.values()``, less the trace and the chunk hook)."""
    import etptr.cuda
    from etptr.cuda import _tuning
    tuning = {k: v for k, v in _tuning.values().items() if k not in ("trace", "chunk_hook")}
    return f"copy config {etptr.cuda.get_copy_config()}; tuning {tuning}"


def layout_files(root, names, seed=1):
    """(name, path) of a checkpoint of each layout in ``names``
    (:func:`etptr.bench._model_shapes.write_layout`), written in turn in a scratch directory
    under ``root``; each file is removed after its turn, the directory at the end."""
    from etptr.bench._model_shapes import write_layout
    tmp = tempfile.mkdtemp(dir=root)
    try:
        for name in names:
            path = write_layout(name, tmp, seed=seed)
            try:
                yield name, path
            finally:
                path.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def host_tensors(path):
    """The tensors of the checkpoint at ``path``, read into host memory (faulted in):
    (numpy arrays, TensorPtrs viewing them)."""
    import numpy as np
    from safetensors.numpy import load_file

    import etptr
    arrays = [np.ascontiguousarray(a) for a in load_file(str(path)).values()]
    return arrays, [etptr.make_tensor_ptr(a) for a in arrays]


def in_turns(fn, modes, rounds=15, calls=1, sync=None):
    """{mode: median seconds per call of ``fn``}, each mode's settings in turns.

    ``modes`` maps a name to a callable that returns a context manager (the settings,
    for instance ``lambda: _tuning.tuned(nt_max=0)``). Each of ``rounds`` rounds enters
    every mode in turn and, inside it, makes one untimed call and then ``calls`` timed
    ones, followed by ``sync()`` when given (for calls that only queue work)."""
    times = {m: [] for m in modes}
    for _ in range(rounds):
        for m, enter in modes.items():
            with enter():
                fn()
                if sync is not None:
                    sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                if sync is not None:
                    sync()
                times[m].append((time.perf_counter() - t0) / calls)
    return {m: statistics.median(t) for m, t in times.items()}
