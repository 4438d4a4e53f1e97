"""Re-shard a safetensors checkpoint into files of at most N MiB, with an index.

    python bench/tools/reshard.py model.safetensors -o shards/ --max-shard-mib 40

writes ``shards/model-00001-of-0000K.safetensors`` ... and
``shards/model.safetensors.index.json`` (``{"metadata": {"total_size": bytes},
"weight_map": {tensor: shard file}}``), the layout sharded checkpoints use.
Tensors keep their names, dtypes, shapes and bytes, in source order; each
shard file (header included) stays within the limit unless a single tensor
is larger, which then gets a shard of its own. The source may itself be an
index. Reading and writing go through the safetensors library (numpy
framework; BFloat16 and Float8 through ml_dtypes).

Useful to carry one shard of a checkpoint where only a few tens of MiB of
files may travel, then run ``etptr-bench SHARD.safetensors`` there.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

if importlib.util.find_spec("etptr") is None:  # run from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MiB = 1 << 20
# safetensors header: 8-byte length, then JSON padded to a multiple of 8
_HEADER_FIXED = 8 + 64


def _entry_bytes(name, shape) -> int:
    """Upper bound of one tensor's header entry, in bytes."""
    entry = {name: {"dtype": "F8_E4M3", "shape": list(shape),
                    "data_offsets": [2 ** 63, 2 ** 63]}}
    return len(json.dumps(entry)) + 8


def plan(items, max_bytes: int) -> list:
    """Group ``[(name, nbytes, header_bytes)]`` into shards of at most ``max_bytes``.

    Greedy in source order; a tensor larger than the limit gets a shard of
    its own. Returns a list of name lists.
    """
    shards, current, used = [], [], _HEADER_FIXED
    for name, nbytes, header in items:
        cost = nbytes + header
        if current and used + cost > max_bytes:
            shards.append(current)
            current, used = [], _HEADER_FIXED
        current.append(name)
        used += cost
    if current:
        shards.append(current)
    return shards


def reshard(sources, out_dir, max_shard_mib: float, prefix: str = "model") -> Path:
    """Write the shards and the index; returns the index path.

    Raises
    ------
    etptr.bench._checkpoint.CheckpointError
        A source that cannot be read.
    ValueError
        A limit that is not positive, or a tensor name found in two sources.
    """
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from etptr.bench._checkpoint import read_tensor, resolve

    if max_shard_mib <= 0:
        raise ValueError(f"max_shard_mib={max_shard_mib} must be positive")
    max_bytes = int(max_shard_mib * MiB)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    where, entries, items, metadata = {}, {}, [], {}
    for file in resolve(sources):
        metadata.update(file.metadata or {})
        for entry in file.tensors:
            name = entry.name
            if name in where:
                raise ValueError(f"tensor {name!r} occurs in {where[name].path} and "
                                 f"{file.path}")
            where[name] = file
            entries[name] = entry
            items.append((name, entry.nbytes, _entry_bytes(name, list(entry.shape))))
    groups = plan(items, max_bytes)
    total = len(groups)
    weight_map, total_size = {}, 0
    for i, names in enumerate(groups, 1):
        shard = f"{prefix}-{i:05d}-of-{total:05d}.safetensors"
        by_source = {}
        for name in names:
            by_source.setdefault(where[name].path, (where[name], []))[1].append(entries[name])
        tensors = {}
        for file, wanted in by_source.values():
            with safe_open(str(file.path), framework="np") as f:
                for entry in wanted:
                    tensors[entry.name] = read_tensor(f, file, entry)
        tensors = {name: tensors[name] for name in names}  # source order
        save_file(tensors, str(out_dir / shard), metadata=metadata or None)
        for name, a in tensors.items():
            weight_map[name] = shard
            total_size += a.nbytes
        del tensors
    index = out_dir / f"{prefix}.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": total_size},
                                 "weight_map": weight_map}, indent=2) + "\n")
    return index


def main(argv=None) -> int:
    """Command line; returns the exit status (0 ok, 2 bad arguments or unreadable source)."""
    p = argparse.ArgumentParser(
        prog="reshard.py",
        description="Re-shard safetensors checkpoint(s) into files of at most N MiB with a "
                    "model.safetensors.index.json.")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="safetensors file(s) or a *.safetensors.index.json")
    p.add_argument("-o", "--out-dir", required=True, metavar="DIR",
                   help="directory for the shards and the index (created if missing)")
    p.add_argument("--max-shard-mib", type=float, default=40.0, metavar="N",
                   help="largest shard file in MiB (2**20 bytes), header included (default: 40)")
    p.add_argument("--prefix", default="model",
                   help="shard and index file prefix (default: model)")
    args = p.parse_args(argv)
    from etptr.bench._checkpoint import CheckpointError

    try:
        index = reshard(args.sources, args.out_dir, args.max_shard_mib, args.prefix)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"reshard.py: error: {exc}", file=sys.stderr)
        return 2
    weight_map = json.loads(index.read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        size = (index.parent / shard).stat().st_size
        print(f"{shard}: {sum(1 for v in weight_map.values() if v == shard)} tensors, "
              f"{size / MiB:.1f} MiB")
    print(f"index: {index} ({len(weight_map)} tensors in {len(shards)} shards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
