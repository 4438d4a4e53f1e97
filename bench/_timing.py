"""Helpers shared by the measurement scripts in bench/ (run as ``python bench/<script>.py``):
a log that is printed as it goes and kept for an output file, and median wall times."""
import statistics
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


def write_log(path):
    """Write every line said so far to ``path``."""
    with open(path, "w") as f:
        f.write("\n".join(LINES) + "\n")
