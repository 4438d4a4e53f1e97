"""Print a pytest-benchmark JSON file as one line per benchmark, grouped.

    python bench/tools/summarize.py bench.json [OUTFILE]

Each line: the benchmark, its median, GB/s (``extra_info["GB/s"]``, as the suites and
their ``throughput`` fixture write it), and its time relative to the fastest benchmark
of its group.
"""
import json
import sys


def main(argv):
    with open(argv[0]) as f:
        data = json.load(f)
    groups = {}
    for b in data["benchmarks"]:
        groups.setdefault(b["group"], []).append(b)
    lines = []
    for group in sorted(groups):
        rows = sorted(groups[group], key=lambda b: b["stats"]["median"])
        fastest = rows[0]["stats"]["median"]
        lines.append(f"[{group}]")
        for b in rows:
            med = b["stats"]["median"]
            rate = b.get("extra_info", {}).get("GB/s")
            lines.append(f"  {b['name']:48s} median {med * 1e6:12.2f} us  "
                         f"{'' if rate is None else f'{rate:8.3f} GB/s'}  x{med / fastest:.2f}")
    cfg = next((b["extra_info"].get("copy_config") for b in data["benchmarks"]
                if b.get("extra_info", {}).get("copy_config")), None)
    lines.append(f"copy_config: {cfg}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
