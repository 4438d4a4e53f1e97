"""The etptr-bench command and bench/tools/reshard.py, on tiny checkpoints, without a GPU.

The GPU path's logic (round-trip check, peer cases, tables, JSON) runs here
against ``FakeCupy``, a stand-in for the few CuPy calls the command makes,
backed by host memory, with ``etptr.testing.HostDeviceAllocator`` as etptr's
CUDA allocator. No figure it prints is a GPU measurement.
"""
import ctypes
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("safetensors")
ml_dtypes = pytest.importorskip("ml_dtypes")

from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

import etptr  # noqa: E402
from etptr.bench import _sweep  # noqa: E402
from etptr.bench.__main__ import main  # noqa: E402
from etptr.bench._checkpoint import read_tensor  # noqa: E402
from etptr.testing import HostDeviceAllocator, use_allocator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--no-progress", "--repeats", "2", "--warmup", "1", "--no-torch"]
# checkpoint mode's last table spawns processes: one test runs it, the others skip it
CKPT = [*COMMON, "--no-fresh"]


def _tensors():
    rng = np.random.default_rng(7)
    return {
        "layer.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "layer.bias": np.array([np.nan, -0.0, np.inf, 1.5], dtype=np.float32),
        "step": np.array(12345678901, dtype=np.int64),
        "embed.bf16": rng.standard_normal((4, 2)).astype(ml_dtypes.bfloat16),
        "scale.f8": np.linspace(-2, 2, 6).astype(ml_dtypes.float8_e4m3fn),
        "mask": np.array([True, False, True]),
        "empty": np.zeros((0, 3), dtype=np.float16),
    }


@pytest.fixture(autouse=True)
def no_real_cupy(monkeypatch):
    """Make ``import cupy`` fail, so the tests take the CPU path on any machine."""
    monkeypatch.setitem(sys.modules, "cupy", None)


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file(_tensors(), str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def sharded(tmp_path):
    tensors = _tensors()
    names = list(tensors)
    shards = {"a-00001-of-00002.safetensors": names[:3], "a-00002-of-00002.safetensors": names[3:]}
    weight_map = {}
    for shard, members in shards.items():
        save_file({n: tensors[n] for n in members}, str(tmp_path / shard))
        weight_map.update({n: shard for n in members})
    index = tmp_path / "a.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def _bytes(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _run(argv, tmp_path, capsys):
    out = tmp_path / "out.json"
    status = main([*argv, *CKPT, "--json", str(out)])
    return status, json.loads(out.read_text()), capsys.readouterr().out


def test_cpu_mode_on_a_file(checkpoint, tmp_path, capsys):
    status, doc, text = _run([str(checkpoint)], tmp_path, capsys)
    tensors = _tensors()
    assert status == 0
    assert doc["mode"] == "checkpoint" and doc["status"] == 0
    assert doc["tensors"] == len(tensors)
    assert doc["bytes"] == sum(a.nbytes for a in tensors.values())
    assert doc["files"] == [str(checkpoint)]
    assert doc["host_clone_mismatches"] == []
    assert doc["environment"]["cuda"] is False
    for key in ("host.make_tensor_ptr", "host.view", "host.flat_view", "host.resize",
                "host.clone", "host.numpy_copy"):
        t = doc["timings"][key]
        assert len(t["samples_s"]) == 2 and t["count"] == len(tensors)
        assert t["median_s"] >= t["best_s"] > 0
    assert doc["timings"]["host.clone"]["nbytes"] == doc["bytes"]
    assert doc["timings"]["host.clone"]["median_gbps"] > 0
    assert "round_trip_mismatches" not in doc and "etptr.h2d" not in doc["timings"]
    assert f"host clone: {len(tensors)}/{len(tensors)} tensors bit-identical" in text


def test_no_cuda_is_one_line(checkpoint, capsys):
    assert main([str(checkpoint), *CKPT]) == 0
    lines = capsys.readouterr().out.splitlines()
    hits = [ln for ln in lines if "CUDA" in ln]
    assert len(hits) == 1
    assert hits[0].startswith("no CUDA: CuPy is not importable") and "CPU parts only" in hits[0]


def test_cpu_flag_names_itself(checkpoint, capsys):
    assert main([str(checkpoint), *CKPT, "--cpu"]) == 0
    assert "no CUDA: --cpu was given; running the CPU parts only" in capsys.readouterr().out


def test_sharded_index(sharded, checkpoint, tmp_path, capsys):
    status, doc, text = _run([str(sharded)], tmp_path, capsys)
    assert status == 0
    assert [Path(f).name for f in doc["files"]] == ["a-00001-of-00002.safetensors",
                                                     "a-00002-of-00002.safetensors"]
    assert doc["tensors"] == len(_tensors())
    assert doc["bytes"] == sum(a.nbytes for a in _tensors().values())
    assert "(2 files)" in text


def test_several_files(checkpoint, sharded, tmp_path, capsys):
    status, doc, _ = _run([str(checkpoint), str(sharded)], tmp_path, capsys)
    assert status == 0
    assert doc["tensors"] == 2 * len(_tensors())
    assert len(doc["files"]) == 3


def test_index_naming_a_missing_tensor_is_refused(sharded, capsys):
    index = json.loads(sharded.read_text())
    index["weight_map"]["ghost"] = "a-00001-of-00002.safetensors"
    sharded.write_text(json.dumps(index))
    assert main([str(sharded), *CKPT]) == 2
    assert "ghost" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["missing.safetensors"], "does not exist"),
    (["--sweep", "x.safetensors"], "either --sweep or checkpoints"),
    (["--quick"], "applies only with --sweep"),
    (["--layout", "qwen2.5-0.5b", "x.safetensors"], "--layout writes its own checkpoint"),
    (["--layout", "no-such-model"], "invalid choice"),
    (["--repeats", "0"], "not a positive integer"),
    (["--sweep", "--max-size", "12 parsecs"], "expected a number"),
    (["--sweep", "--line-rate-size", "1GiB"], "applies to checkpoint mode"),
    (["--fresh", "--many"], "separate modes"),
    (["--tp", "--fresh"], "separate modes"),
    (["--cache", "cold"], "--cache applies only with --fresh"),
    (["--fresh", "--loaders", "etptr,nosuch"], "nosuch: choose from"),
    (["--fresh", "--cache", "lukewarm"], "lukewarm: choose from"),
    (["--tp", "two"], "world sizes like 2,4,8"),
    (["--tp", "--plot", "x.png"], "print tables"),
    (["--dir", "/no/such/dir"], "not a directory"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    try:
        status = main([*argv, "--no-progress"])
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    assert message in capsys.readouterr().err


def test_runs_without_tqdm(monkeypatch, checkpoint, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert main([str(checkpoint), "--repeats", "1", "--warmup", "0", "--no-torch"]) == 0
    assert "host clone: 7/7 tensors bit-identical" in capsys.readouterr().out


def test_plot_without_matplotlib_is_refused(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as exc:
        main(["--sweep", "--plot", "p.png", *COMMON])
    assert exc.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_checkpoint_mode_without_safetensors_is_refused(monkeypatch, checkpoint, capsys):
    # a plain `pip install etptr` has the command but not the [bench] extra
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(SystemExit) as exc:
        main([str(checkpoint), *CKPT])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "safetensors library, which is not installed" in err and "etptr[bench]" in err


def test_help_gives_units(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for word in ("GB/s", "1e9 bytes", "MiB", "--sweep", "--json", "--plot", "median"):
        assert word in text


def test_not_a_safetensors_file(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x01\x02")
    assert main([str(bad), *CKPT]) == 2
    err = capsys.readouterr().err
    assert "bad.safetensors" in err and "too short for the 8-byte header length" in err


def test_cpu_sweep_writes_plot_and_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot, out = tmp_path / "sweep.png", tmp_path / "sweep.json"
    status = main(["--sweep", "--max-size", "64KiB", "--plot", str(plot), "--json", str(out),
                   *COMMON])
    assert status == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text())
    assert doc["mode"] == "sweep"
    assert doc["sizes"] == [4096, 8192, 16384, 32768, 65536]
    assert set(doc["gbps"]) == {"host.clone", "host.numpy_copy"}
    assert all(v > 0 for v in doc["gbps"]["host.clone"])
    assert doc["round_trip_mismatch_sizes"] == []
    assert "bit-identical at 5/5 sizes" in capsys.readouterr().out


def test_sweep_sizes():
    full = _sweep.sweep_sizes(quick=False)
    assert full[0] == 4 << 10 and full[-1] == 1 << 30 and len(full) == 19
    assert _sweep.sweep_sizes(quick=True) == [4 << 10, 64 << 10, 1 << 20, 16 << 20,
                                              256 << 20, 1 << 30]
    assert _sweep.sweep_sizes(quick=True, max_size=1 << 20) == [4 << 10, 64 << 10, 1 << 20]
    rep = _sweep.repeats_for(10)
    assert rep(4096) == 10 and rep(128 << 20) == 5 and rep(1 << 30) == 3


# --------------------------------------------------------------- GPU path on a stand-in

class _FakeDeviceArray:
    """Device memory simulated with a host array (``.data.ptr``, slicing, ``get()``)."""

    def __init__(self, array):
        self._a = array
        self.data = types.SimpleNamespace(ptr=array.ctypes.data)

    def __getitem__(self, key):
        return _FakeDeviceArray(self._a[key])

    def get(self):
        return self._a.copy()


class _FakePinned(bytearray):
    """Page-locked memory stand-in: a buffer with a ``ptr``."""

    @property
    def ptr(self):
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.__version__ = "0+hostmemory"
    cp.uint8 = np.uint8
    cp.asarray = lambda a: _FakeDeviceArray(np.array(a, copy=True))
    cp.empty = lambda n, dtype=np.uint8: _FakeDeviceArray(np.empty(n, dtype))
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    cp.get_default_pinned_memory_pool = lambda: pool

    class Device:
        def __init__(self, index=0):
            self.id = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            return None

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: {"name": b"host-memory stand-in"},
        memcpyHostToDevice=1, memcpyDeviceToHost=2,
        memcpyAsync=lambda dst, src, n, kind, stream: ctypes.memmove(dst, src, n))
    cp.cuda = types.SimpleNamespace(
        Device=Device, runtime=runtime,
        Stream=lambda non_blocking=False: types.SimpleNamespace(ptr=0, synchronize=lambda: None),
        alloc_pinned_memory=lambda n: _FakePinned(n))
    return cp


class _CorruptingAllocator(HostDeviceAllocator):
    """Flips the first byte of every device->host copy of more than one byte."""

    def copy_device_to_host(self, dst, src, nbytes, index):
        super().copy_device_to_host(dst, src, nbytes, index)
        if nbytes > 1:
            ctypes.c_uint8.from_address(dst).value ^= 0xFF


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    alloc = HostDeviceAllocator()
    with use_allocator(alloc):
        yield alloc


def test_gpu_path_on_stand_in(fake_gpu, checkpoint, tmp_path, capsys):
    status, doc, text = _run([str(checkpoint), "--line-rate-size", "1MiB"], tmp_path, capsys)
    n = len(_tensors())
    assert status == 0
    assert doc["round_trip_mismatches"] == []
    assert doc["environment"]["cuda"] is True and doc["environment"]["etptr_cuda"] is True
    for key in ("etptr.h2d", "etptr.d2h", "cupy.h2d", "cupy.d2h", "line.h2d", "line.d2h",
                "tiny.etptr.h2d", "tiny.etptr.d2h", "tiny.cupy.h2d", "tiny.cupy.d2h"):
        assert key in doc["timings"]
    assert doc["timings"]["tiny.etptr.h2d"]["nbytes"] == 4
    assert set(doc["ratios"]["tiny_time"]["cupy"]) == {"h2d", "d2h"}
    assert doc["timings"]["line.h2d"]["nbytes"] == 1 << 20
    assert set(doc["ratios"]) >= {"cupy", "line"}
    assert fake_gpu.h2d_count >= n - 1 and fake_gpu.d2h_count >= n - 1
    assert (f"round trip (clone_tensor_ptr_to and clone_tensor_ptrs_to, up then down): {n}/{n} "
            f"tensors bit-identical both ways") in text
    for key in ("etptr_batch.h2d", "etptr_batch.d2h", "file.etptr.load", "file.etptr.save",
                "file.cupy.load"):
        assert key in doc["timings"]
    assert doc["load_mismatches"] == [] and doc["save_mismatches"] == []
    assert f"checkpoint load (etptr.load_safetensors): {n}/{n} tensors bit-identical" in text
    assert "no CUDA" not in text
    assert fake_gpu.live_bytes == 0


def test_gpu_round_trip_mismatch_exits_1(monkeypatch, checkpoint, capsys):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    with use_allocator(_CorruptingAllocator()):
        status = main([str(checkpoint), *CKPT, "--line-rate-size", "4KiB"])
    text = capsys.readouterr().out
    n = len(_tensors())
    assert status == 1
    # only the zero-byte tensor survives the corruption
    assert f"{1}/{n} tensors bit-identical; differ: " in text
    assert "layer.weight" in text.split("differ: ")[1].splitlines()[0]


def test_gpu_sweep_on_stand_in(fake_gpu, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    status = main(["--sweep", "--quick", "--max-size", "64KiB", "--json", str(out), *COMMON])
    doc = json.loads(out.read_text())
    assert status == 0
    assert doc["sizes"] == [4096, 65536]
    assert {"etptr.h2d", "etptr.d2h", "cupy.h2d", "cupy.d2h", "line.h2d", "line.d2h"} <= set(
        doc["gbps"])
    assert "etptr.h2d_pinned" not in doc["gbps"]  # etptr.empty has no pinned= here
    assert doc["round_trip_mismatch_sizes"] == []
    assert "H2D (GB/s)" in capsys.readouterr().out


def test_without_etptr_cuda_allocator_measures_peers(monkeypatch, checkpoint, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setattr(etptr, "get_device_allocator", lambda device_type: None)
    status, doc, text = _run([str(checkpoint), "--line-rate-size", "4KiB"], tmp_path, capsys)
    assert status == 0
    assert doc["round_trip_mismatches"] is None
    assert "cupy.h2d" in doc["timings"] and "etptr.h2d" not in doc["timings"]
    assert "etptr columns skipped" in text


# --------------------------------------------------------------- reshard.py

def _load_reshard():
    spec = importlib.util.spec_from_file_location("reshard",
                                                  ROOT / "bench" / "tools" / "reshard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reshard_round_trip(tmp_path, capsys):
    reshard = _load_reshard()
    rng = np.random.default_rng(3)
    src = {f"w{i}": rng.standard_normal((64, 1024)).astype(np.float32) for i in range(5)}
    src.update(_tensors())
    src_path = tmp_path / "src.safetensors"
    save_file(src, str(src_path), metadata={"format": "pt"})
    out_dir = tmp_path / "shards"
    limit_mib = 0.6  # each w* is 256 KiB: two per shard
    assert reshard.main([str(src_path), "-o", str(out_dir), "--max-shard-mib", str(limit_mib)]) == 0
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(src)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in src.values())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 3
    for shard in shards:
        assert (out_dir / shard).stat().st_size <= limit_mib * (1 << 20)
    for name, shard in index["weight_map"].items():
        plan = etptr.checkpoint.parse_header(out_dir / shard)
        entry, = [t for t in plan.tensors if t.name == name]
        with safe_open(str(out_dir / shard), framework="np") as f:
            assert f.metadata() == {"format": "pt"}
            got = read_tensor(f, plan, entry)
        assert got.dtype == src[name].dtype and got.shape == src[name].shape
        assert np.array_equal(_bytes(got), _bytes(src[name]))
    assert "3 shards" in capsys.readouterr().out
    # the result is a checkpoint etptr-bench takes
    assert main([str(out_dir / "model.safetensors.index.json"), *CKPT]) == 0


def test_reshard_oversized_tensor_gets_own_shard(tmp_path):
    reshard = _load_reshard()
    assert reshard.plan([("a", 10, 1), ("big", 500, 1), ("b", 10, 1), ("c", 10, 1)], 100) == [
        ["a"], ["big"], ["b", "c"]]


def test_reshard_bad_source(tmp_path, capsys):
    reshard = _load_reshard()
    assert reshard.main([str(tmp_path / "nope.safetensors"), "-o", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cpu_mode_times_checkpoint_load_and_save(checkpoint, tmp_path, capsys):
    status, doc, text = _run([str(checkpoint)], tmp_path, capsys)
    n = len(_tensors())
    assert status == 0
    assert {"file.cpu.etptr.map", "file.cpu.etptr.into", "file.cpu.etptr.save"} <= set(doc["timings"])
    # the safetensors library's NumPy side cannot read bfloat16 and float8: no row for it
    assert "file.cpu.safetensors.load" not in doc["timings"]
    assert doc["load_mismatches"] == [] and doc["save_mismatches"] == []
    assert f"checkpoint save (etptr.save_safetensors, read back): {n}/{n}" in text
    assert "MB/s" in text                    # a tiny checkpoint's rates are not "0.0 GB/s"
    assert "etptr.load_safetensors(device='cpu'): a map, no byte read" in text
    assert "compare it with a map only" in text
    files = doc["ratios"]["files"]
    assert files["etptr.map"]["map"] is True and files["etptr.into"]["map"] is False


def test_cpu_loads_are_compared_map_with_map_and_read_with_read(tmp_path, capsys):
    path = _plain_checkpoint(tmp_path)
    status, doc, text = _run([str(path)], tmp_path, capsys)
    assert status == 0
    files = doc["ratios"]["files"]
    assert files["etptr.into"]["peer"] == "safetensors.load"
    assert files["etptr.into"]["x_peer"] > 0
    assert "safetensors.numpy.load_file: every byte read" in text
    assert "x safetensors" in text                        # the save table's column


def test_a_directory_is_refused_with_a_hint(tmp_path, capsys):
    assert main([str(tmp_path), *CKPT]) == 2
    assert "pass a .safetensors file or a sharded checkpoint's" in capsys.readouterr().err


def test_the_same_file_twice_is_measured_once(checkpoint, tmp_path, capsys):
    status, doc, text = _run([str(checkpoint), str(checkpoint)], tmp_path, capsys)
    assert status == 0 and doc["files"] == [str(checkpoint)]
    assert "is given more than once" in text


def test_layout_writes_and_measures_a_model_shaped_checkpoint(monkeypatch, tmp_path, capsys):
    from etptr.bench import _model_shapes
    tiny = _model_shapes.qwen2_layout("tiny-qwen", hidden=8, layers=2, intermediate=16, heads=2,
                                 kv_heads=1, head_dim=4, vocab=32)
    monkeypatch.setitem(_model_shapes.LAYOUTS, "tiny-qwen", tiny)
    plot = tmp_path / "bars.png"
    status, doc, text = _run(["--layout", "tiny-qwen", "--plot", str(plot)], tmp_path, capsys)
    assert status == 0 and doc["tensors"] == tiny.tensors and doc["bytes"] == tiny.nbytes
    assert "writing a checkpoint shaped like tiny-qwen" in text
    assert plot.stat().st_size > 0
    assert not any(Path(f).exists() for f in doc["files"])      # the temporary file is gone


def test_many_without_cuda_says_so_in_one_line(capsys):
    assert main(["--many", *COMMON]) == 0
    out = capsys.readouterr().out
    assert "--many needs CUDA" in out
    assert "CPU parts" not in out                 # --many has none to run
    assert "peers only" not in out and "no CUDA path" not in out     # one line, no contradiction


def _plain_checkpoint(tmp_path):
    """Tensors the safetensors library's NumPy side reads too (no bfloat16)."""
    rng = np.random.default_rng(5)
    path = tmp_path / "plain.safetensors"
    save_file({"model.layers.0.self_attn.q_proj.weight": rng.standard_normal((8, 6)).astype(np.float32),
               "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((6, 8)).astype(np.float32),
               "model.norm.weight": np.ones(6, np.float32),
               "step": np.arange(5, dtype=np.int64)}, str(path))
    return path


def test_fresh_mode_times_each_loader_in_a_process_of_its_own(tmp_path, capsys):
    path = _plain_checkpoint(tmp_path)
    out_json = tmp_path / "fresh.json"
    status = main([str(path), "--fresh", "--cpu", "--cache", "warm", "--loaders",
                   "etptr,safetensors", "--no-progress", "--json", str(out_json)])
    text = capsys.readouterr().out
    assert status == 0, text
    assert "etptr (a map: pages are read when first touched)" in text
    assert "the bound of a cold load" in text and "a map's time, not a read's" in text
    doc = json.loads(out_json.read_text())
    assert doc["mode"] == "fresh" and doc["mismatches"] == {}
    rows = {r["loader"]: r for r in doc["fresh"]}
    assert rows["etptr"]["map"] is True and rows["safetensors"]["map"] is False
    assert rows["etptr"]["differ"] == [] and rows["etptr"]["first_s"] > 0
    assert rows["etptr"]["bytes"] == rows["safetensors"]["bytes"] == 8 * 6 * 4 * 2 + 24 + 40


def test_tp_mode_reads_every_ranks_share(tmp_path, capsys):
    path = _plain_checkpoint(tmp_path)
    out_json = tmp_path / "tp.json"
    status = main([str(path), "--tp", "2,3", *COMMON, "--json", str(out_json)])
    text = capsys.readouterr().out
    assert status == 0, text
    assert "etptr get_slices GB/s" in text
    doc = json.loads(out_json.read_text())
    assert doc["mode"] == "tp" and doc["worlds"] == [2, 3]
    # the split weights once over the ranks, the others whole on every rank
    assert doc["timings"]["tp2.etptr"]["nbytes"] == 8 * 6 * 4 * 2 + 2 * (24 + 40)
    assert doc["timings"]["tp3.etptr"]["nbytes"] == 8 * 6 * 4 * 2 + 3 * (24 + 40)


def test_checkpoint_mode_ends_with_the_fresh_process_table(tmp_path, capsys):
    path = _plain_checkpoint(tmp_path)
    out_json = tmp_path / "out.json"
    status = main([str(path), *COMMON, "--cpu", "--json", str(out_json)])
    text = capsys.readouterr().out
    assert status == 0, text
    assert text.index("saves into") < text.index("loader (fresh process)")
    doc = json.loads(out_json.read_text())
    rows = doc["fresh"]["fresh"]
    assert {r["condition"] for r in rows} == {"warm", "cold", "half"}
    loaders = {r["loader"] for r in rows}
    assert {"etptr", "safetensors"} <= loaders
    assert "etptr-set-up" not in loaders          # on the CPU etptr sets nothing up
    assert all(r["differ"] in ([], None) for r in rows)
