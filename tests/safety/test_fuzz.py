"""Bad-input fuzzing (tests/safety/_fuzz_main.py, in a subprocess) and regressions it found.

The fuzz run throws at least 10,000 generated bad and edge inputs at
make_tensor_ptr (every overload), alias views, resize_tensor_ptr,
clone_tensor_ptr, the maker functions, device clones and the importers. It
runs in a subprocess so that a crash fails this test instead of killing the
test run. ETPTR_FUZZ_SEED fixes hypothesis' seed (the run prints the one it
used); ETPTR_FUZZ_SCALE multiplies the number of inputs.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import etptr
from etptr import ScalarType

HERE = Path(__file__).resolve().parent


def test_fuzz_bad_inputs(tmp_path, capsys):
    pytest.importorskip("hypothesis")
    # the subprocess imports the etptr this process imports (a build in place or an install)
    etptr_root = str(Path(etptr.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [etptr_root, str(HERE), str(HERE.parent)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-X", "faulthandler", "-W", "error", str(HERE / "_fuzz_main.py"),
           "--scale", os.environ.get("ETPTR_FUZZ_SCALE", "1")]
    if os.environ.get("ETPTR_FUZZ_SEED"):
        cmd += ["--seed", os.environ["ETPTR_FUZZ_SEED"]]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    how = (f"killed by signal {-proc.returncode} (a crash)" if proc.returncode < 0
           else f"exit status {proc.returncode}")
    assert proc.returncode == 0, f"fuzz process failed: {how}\n{out[-12000:]}"
    tried = int(re.search(r"inputs tried: (\d+)", out).group(1))
    with capsys.disabled():
        line = re.search(r"inputs tried: .*", out).group(0)
        leak = re.search(r"leak check: .*", out).group(0)
        print(f"\nfuzz: {line}; {leak}")
    assert tried >= 10_000 * float(os.environ.get("ETPTR_FUZZ_SCALE", "1"))
    assert "fuzz: ok" in out


# ------------------------------------------------------------------ regressions found by the fuzz run

@pytest.mark.parametrize("sizes", [{"a": 1}, {0: 1}, np.array(3), np.array([[1, 2]])],
                         ids=["dict-str-keys", "dict-int-keys", "ndarray-0d", "ndarray-2d"])
def test_sizes_that_are_not_sequences(sizes):
    # a mapping or a 0-d/2-d array escaped as KeyError/TypeError, or was read as its keys
    with pytest.raises(etptr.InvalidTypeError, match="sizes must be a sequence"):
        etptr.make_tensor_ptr(sizes, None)
    with pytest.raises(etptr.InvalidTypeError, match="dim_order must be a sequence"):
        etptr.make_tensor_ptr([1], None, dim_order=sizes)
    with pytest.raises(etptr.InvalidTypeError, match="sizes must be a sequence"):
        etptr.resize_tensor_ptr(etptr.zeros([1]), sizes)
    assert etptr.make_tensor_ptr(np.array([2, 3]), None).sizes == (2, 3)


@pytest.mark.parametrize("values", [[1.5, 10**400], [True, -(10**309)], [10**400, 2.0]])
def test_float_list_with_int_beyond_double(values):
    # a mixed list is deduced Float; an int beyond a double's range escaped as OverflowError
    with pytest.raises(etptr.InvalidArgumentError, match=r"data\[\d\]=.* does not fit a double"):
        etptr.make_tensor_ptr([2], values)
    assert etptr.make_tensor_ptr([2], [1.5, 10**300]).scalar_type == ScalarType.Float


def test_view_device_of_wrong_type():
    # the alias overload compared device == "cpu"; a NumPy array made that ambiguous (ValueError)
    src = etptr.zeros([4])
    with pytest.raises(etptr.InvalidTypeError, match="device"):
        etptr.make_tensor_ptr(src, device=np.array([1, 2]))
    with pytest.raises(etptr.InvalidTypeError, match="device"):
        etptr.make_tensor_ptr(src, [2, 2], device=2.5)
    assert etptr.make_tensor_ptr(src, device="cpu").device == etptr.Device("cpu")


@pytest.mark.parametrize("value,exc", [
    (np.str_("abc"), etptr.InvalidTypeError),          # escaped as ValueError from the cast
    (np.datetime64(1, "s"), etptr.InvalidTypeError),
    (np.complex64(1j), etptr.InvalidTypeError),       # was cast with a ComplexWarning
    (np.void(b"ab"), etptr.InvalidTypeError),
    (2**70, etptr.InvalidArgumentError),               # escaped as OverflowError
    (-(2**63) - 1, etptr.InvalidArgumentError),
    (np.uint64(2**64 - 1), etptr.InvalidArgumentError),
])
def test_fill_values_that_are_no_scalar(value, exc):
    with pytest.raises(exc, match="fill_value"):
        etptr.full([2], value, ScalarType.Int)
    with pytest.raises(exc, match="fill_value"):
        etptr.full_like(etptr.zeros([2]), value)


def test_fill_values_at_the_edges():
    assert etptr.full([1], 2**63 - 1, ScalarType.Long).numpy()[0] == 2**63 - 1
    assert etptr.full([1], -(2**63), ScalarType.Long).numpy()[0] == -(2**63)
    assert etptr.full([1], np.float16(1.5), ScalarType.Double).numpy()[0] == 1.5
    assert etptr.full([1], np.bool_(True), ScalarType.Bool).numpy()[0]
    assert np.isnan(etptr.full([1], float("nan")).numpy()[0])


@pytest.mark.parametrize("bad", [5, 2.5, None, object()])
def test_for_blob_sequences_of_wrong_type(bad):
    # list(x) in the builder escaped as TypeError for non-iterables
    buf = np.zeros(4, np.float32)
    if bad is not None:
        with pytest.raises(etptr.InvalidTypeError, match="sizes"):
            etptr.for_blob(buf, bad).make_tensor_ptr()
    with pytest.raises(etptr.EtError):
        etptr.for_blob(buf, [4]).dim_order(bad if bad is not None else "x").make_tensor_ptr()
    with pytest.raises(etptr.EtError):
        etptr.for_blob(buf, [4]).strides(bad if bad is not None else "x").make_tensor_ptr()


def test_for_blob_keeps_a_copy_of_its_lists():
    buf = np.zeros(6, np.float32)
    sizes = [2, 3]
    b = etptr.for_blob(buf, sizes)
    sizes.append(9)
    assert b.make_tensor_ptr().sizes == (2, 3)


@pytest.mark.parametrize("call", [
    lambda x: etptr.clone_tensor_ptr(x),
    lambda x: etptr.resize_tensor_ptr(x, [1]),
    lambda x: etptr.clone_tensor_ptr_to_device(x),
    lambda x: etptr.clone_tensor_ptr_to_cpu(x),
    lambda x: etptr.empty_like(x),
    lambda x: etptr.full_like(x, 1),
    lambda x: etptr.zeros_like(x),
    lambda x: etptr.ones_like(x),
    lambda x: etptr.rand_like(x),
    lambda x: etptr.randn_like(x),
    lambda x: etptr.randint_like(x, 0, 3),
], ids=["clone", "resize", "to_device", "to_cpu", "empty_like", "full_like", "zeros_like",
        "ones_like", "rand_like", "randn_like", "randint_like"])
@pytest.mark.parametrize("bad", [None, 5, np.zeros(2), "tensor"], ids=["None", "int", "ndarray", "str"])
def test_tensor_arguments_of_wrong_type(call, bad):
    # Cython's argument type check raised a plain TypeError (and none for None)
    with pytest.raises(etptr.InvalidTypeError, match="must be an etptr.TensorPtr"):
        call(bad)


def test_host_device_allocator_out_of_memory():
    # the allocator contract says MemoryAllocationError; ctypes' MemoryError escaped
    from etptr.testing import HostDeviceAllocator, use_allocator
    alloc = HostDeviceAllocator()
    with pytest.raises(etptr.MemoryAllocationError, match="nbytes"):
        alloc.allocate(2**50, 0)
    with use_allocator(alloc):
        with pytest.raises(etptr.MemoryAllocationError):
            etptr.empty([2**50], ScalarType.Byte, device="cuda")
        with pytest.raises(etptr.MemoryAllocationError):
            etptr.zeros([2**50], ScalarType.Byte, device="cuda")
    assert alloc.live_bytes == 0


def test_list_with_long_double_beyond_double():
    # NumPy's overflow RuntimeWarning escaped (an error under -W error); now refused like big ints
    big = np.longdouble("1e4000")
    if not np.isfinite(big):
        pytest.skip("long double is double on this platform")
    with pytest.raises(etptr.InvalidArgumentError, match=r"data\[1\]=.* does not fit a double"):
        etptr.make_tensor_ptr([2], [1.5, big])
    assert etptr.make_tensor_ptr([np.longdouble(2.5)]).numpy()[0] == 2.5


@pytest.mark.parametrize("value", [np.timedelta64(3, "s"), np.datetime64(1, "s")])
def test_list_with_time_values(value):
    # np.timedelta64 is an np.integer subclass: it was deduced as Long and escaped as TypeError
    with pytest.raises(etptr.InvalidTypeError, match=r"data\[0\]=.* is not a number"):
        etptr.make_tensor_ptr([value, 1])


def test_object_arrays_are_not_aliased():
    # a writable tensor over PyObject pointers let a write corrupt the interpreter; the
    # fuzz run's write of 0x41 bytes crashed it when the array was freed
    a = np.array([object(), object()], dtype=object)
    with pytest.raises(etptr.InvalidTypeError, match="Python objects"):
        etptr.make_tensor_ptr([2], a, type=ScalarType.Long)
    with pytest.raises(etptr.InvalidTypeError, match="Python objects"):
        etptr.make_tensor_ptr([1], memoryview(a), type=ScalarType.Long)
    with pytest.raises(etptr.InvalidTypeError, match="Python objects"):
        etptr.from_blob(np.zeros(2, dtype=[("o", object), ("f", "f8")]), [2], ScalarType.Double)
    with pytest.raises(etptr.InvalidTypeError):
        etptr.make_tensor_ptr(a)


def test_clone_tensor_ptr_to_non_tensor():
    with pytest.raises(etptr.InvalidTypeError):
        etptr.clone_tensor_ptr_to(5, "cuda")
