"""load_safetensors(..., into=...): a checkpoint read into existing tensors (TensorPtrs on
the CPU or a device, NumPy arrays, torch tensors), checked before a byte moves, with
strict= as torch's load_state_dict; and framework= for the loaded tensors."""
import os

import numpy as np
import pytest

import etptr
from etptr.checkpoint import CheckpointError, IncompatibleKeys
from etptr.testing import HostDeviceAllocator, use_allocator
from _checkpoint_helpers import tiny_bert

RNG = np.random.default_rng(5)
ARRAYS = {"emb": RNG.standard_normal((6, 4)).astype(np.float32),
          "w": RNG.integers(-9, 9, (3, 5)).astype(np.int32),
          "b": RNG.standard_normal(5).astype(np.float16),
          "z": np.zeros((0, 2), np.float32)}


@pytest.fixture
def ckpt(tmp_path):
    """Two shards and their index."""
    first = {k: ARRAYS[k] for k in ("emb", "z")}
    second = {k: ARRAYS[k] for k in ("w", "b")}
    for name, part in (("a", first), ("b", second)):
        etptr.save_safetensors({k: etptr.make_tensor_ptr(v) for k, v in part.items()},
                               tmp_path / f"{name}.safetensors")
    index = tmp_path / "m.safetensors.index.json"
    index.write_text('{"weight_map": {"emb": "a.safetensors", "z": "a.safetensors", '
                     '"w": "b.safetensors", "b": "b.safetensors"}}')
    return index


def _zeros_like(arrays):
    return {k: np.zeros_like(v) for k, v in arrays.items()}


def test_numpy_targets_are_filled_in_place(ckpt):
    targets = _zeros_like(ARRAYS)
    before = {k: v.ctypes.data for k, v in targets.items()}
    assert etptr.load_safetensors(ckpt, into=targets) == IncompatibleKeys([], [])
    for k, v in targets.items():
        assert v.ctypes.data == before[k] and np.array_equal(v, ARRAYS[k]), k


def test_torch_targets_are_filled_in_place(ckpt):
    torch = pytest.importorskip("torch")
    model = {k: torch.zeros(v.shape, dtype=getattr(torch, str(v.dtype))) for k, v in ARRAYS.items()}
    ptrs = {k: t.data_ptr() for k, t in model.items()}
    etptr.load_safetensors(ckpt, into=model)
    for k, t in model.items():
        assert t.data_ptr() == ptrs[k] and np.array_equal(t.numpy(), ARRAYS[k]), k


def test_device_targets_take_no_memory(ckpt):
    alloc = HostDeviceAllocator()
    with use_allocator(alloc):
        targets = {k: etptr.empty(list(v.shape), type=v.dtype, device="cuda")
                   for k, v in ARRAYS.items()}
        allocated = alloc.allocate_count
        seen = []
        etptr.load_safetensors(ckpt, into=targets, progress=lambda d, t: seen.append((d, t)))
        assert alloc.allocate_count == allocated       # nothing but the targets
        total = sum(v.nbytes for v in ARRAYS.values())
        assert seen[-1] == (total, total)
        for k, t in targets.items():
            assert np.array_equal(etptr.clone_tensor_ptr_to_cpu(t).numpy(), ARRAYS[k]), k


@pytest.mark.parametrize("where", ["cpu", "device"])
def test_tied_targets_take_the_name_listed_last(tmp_path, where):
    # one tensor under two names (tied weights): read once, from the name the file
    # lists last, as copying one name after the other would leave it
    p = tmp_path / "tied.safetensors"
    etptr.save_safetensors({"emb": np.full(4, 1.0, np.float32),
                            "head": np.full(4, 2.0, np.float32)}, p)
    last = etptr.safe_open(p).offset_keys()[-1]
    with use_allocator(HostDeviceAllocator(etptr.DeviceType.CUDA)):
        shared = etptr.zeros([4])
        if where == "device":
            shared = etptr.clone_tensor_ptr_to(shared, "cuda")
        assert etptr.load_safetensors(p, into={"emb": shared, "head": shared}) == ([], [])
        got = (etptr.clone_tensor_ptr_to_cpu(shared) if where == "device" else shared).numpy()
    assert got.tolist() == [1.0 if last == "emb" else 2.0] * 4


def test_overlapping_targets_are_refused_naming_both(tmp_path):
    p = tmp_path / "o.safetensors"
    etptr.save_safetensors({"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}, p)
    memory = np.zeros(6, np.float32)
    with pytest.raises(CheckpointError, match="targets of 'a' and 'b' overlap"):
        etptr.load_safetensors(p, into={"a": memory[0:4], "b": memory[2:6]})
    assert not memory.any()


def test_strict_names_both_sides_and_loose_loads_the_rest(ckpt):
    targets = _zeros_like(ARRAYS)
    del targets["b"]
    targets["extra"] = np.zeros(3)
    with pytest.raises(CheckpointError, match="missing from the checkpoint: 'extra'; not in "
                                              "into: 'b'"):
        etptr.load_safetensors(ckpt, into=targets)
    assert not targets["emb"].any()                     # nothing moved
    got = etptr.load_safetensors(ckpt, into=targets, strict=False)
    assert got == IncompatibleKeys(missing_keys=["extra"], unexpected_keys=["b"])
    assert np.array_equal(targets["w"], ARRAYS["w"]) and not targets["extra"].any()


@pytest.mark.parametrize("bad, match", [
    (np.zeros((6, 5), np.float32), r"into\['emb'\]: shape \[6, 5\], the checkpoint's is \[6, 4\]"),
    (np.zeros((6, 4), np.float64), r"into\['emb'\]: ScalarType.Double, the checkpoint's is F32"),
    (np.zeros((4, 6), np.float32).T, r"into\['emb'\]: dim_order \(1, 0\)"),
    ("ro", r"into\['emb'\] is read-only"),
    ([0.0] * 24, r"tensor 'emb': expected an etptr.TensorPtr"),
])
def test_a_target_that_does_not_fit_is_refused_before_any_byte_moves(ckpt, bad, match):
    targets = _zeros_like(ARRAYS)
    if isinstance(bad, str):
        bad = np.zeros((6, 4), np.float32)
        bad.flags.writeable = False
    targets["emb"] = bad
    with pytest.raises(CheckpointError, match=match):
        etptr.load_safetensors(ckpt, into=targets)
    assert not any(np.any(v) for k, v in targets.items() if k != "emb")


def test_a_failure_part_way_says_which_targets_were_written(ckpt):
    shard = ckpt.parent / "b.safetensors"
    targets = _zeros_like(ARRAYS)
    plan = etptr.checkpoint.read_plan(ckpt)           # the headers read, then a shard shrinks
    real = etptr.checkpoint._into.open_checked

    def shrink_then_open(p):
        if p.path == shard:
            os.truncate(shard, 64)
        return real(p)

    etptr.checkpoint._into.open_checked = shrink_then_open
    try:
        with pytest.raises(CheckpointError, match=r"b.safetensors: reading into existing "
                                                  r"tensors failed .*the targets of earlier "
                                                  r"files were written \('emb', 'z'\)"):
            etptr.checkpoint._into.load_into(plan, targets, True, None)
    finally:
        etptr.checkpoint._into.open_checked = real
    assert np.array_equal(targets["emb"], ARRAYS["emb"])


@pytest.mark.parametrize("into, match", [(5, "into: expected a mapping"),
                                          ({}, "strict=1 is not a bool")])
def test_bad_into_arguments(ckpt, into, match):
    with pytest.raises(CheckpointError, match=match):
        etptr.load_safetensors(ckpt, into=into, strict=1 if into == {} else True)


def test_framework_of_a_load(ckpt):
    torch = pytest.importorskip("torch")
    as_np = etptr.load_safetensors(ckpt, "cpu", framework="np")
    assert all(isinstance(v, np.ndarray) and np.array_equal(v, ARRAYS[k])
               for k, v in as_np.items())
    as_pt = etptr.load_safetensors(ckpt, "cpu", framework="pt")
    assert all(isinstance(v, torch.Tensor) and np.array_equal(v.numpy(), ARRAYS[k])
               for k, v in as_pt.items())
    with use_allocator(HostDeviceAllocator()):
        with pytest.raises(CheckpointError, match="framework='np' gives host arrays"):
            etptr.load_safetensors(ckpt, "cuda", framework="np")


def test_save_takes_numpy_and_torch_tensors_in_place(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "s.safetensors"
    etptr.save_safetensors({"n": ARRAYS["emb"].T, "t": torch.arange(6, dtype=torch.int16),
                            "p": etptr.ones([2])}, p)
    back = etptr.load_safetensors(p, "cpu", framework="np")
    assert np.array_equal(back["n"], ARRAYS["emb"].T) and back["t"].tolist() == list(range(6))
    with pytest.raises(CheckpointError, match="tensor 'g' .*cannot be read in place.*detach"):
        etptr.save_safetensors({"g": torch.ones(2, requires_grad=True)}, p)
    for gapped in (torch.arange(20.).reshape(4, 5)[:, ::2], torch.arange(3.).expand(4, 3)):
        with pytest.raises(CheckpointError,
                           match=r"tensor 's' .*cannot be read in place.*x\.contiguous\(\)"):
            etptr.save_safetensors({"s": gapped}, p)


def test_a_transformers_model_loaded_in_place_gives_its_own_logits(tmp_path):
    # the model's own loading (from_pretrained) against a fresh model of the same config
    # whose parameters etptr fills in place: the same outputs, bit for bit
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_bert(transformers, torch, seed=0).save_pretrained(tmp_path / "bert",
                                                              safe_serialization=True)
        theirs = transformers.BertModel.from_pretrained(tmp_path / "bert").eval()
        mine = tiny_bert(transformers, torch, seed=1).eval()    # other weights until the load
    files = sorted((tmp_path / "bert").glob("*.safetensors"))
    result = etptr.load_safetensors([str(f) for f in files], into=mine.state_dict(),
                                    strict=False)
    assert set(result.unexpected_keys) <= {"pooler.dense.bias", "pooler.dense.weight"}
    ids = torch.tensor([[1, 5, 7, 42, 98, 3]])
    with torch.no_grad():
        assert torch.equal(mine(ids).last_hidden_state, theirs(ids).last_hidden_state)
