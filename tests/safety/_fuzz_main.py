"""Bad-input fuzzing of etptr's public functions (run by tests/safety/test_fuzz.py in a subprocess).

Hypothesis throws generated bad and edge inputs at every make_tensor_ptr
overload, alias views, resize_tensor_ptr, clone_tensor_ptr, the maker
functions, device clones (through HostDeviceAllocator) and the DLPack / CUDA
Array Interface importers. Each input must either work (and then the result
must satisfy ExecuTorch's metadata rules) or raise an etptr exception
(``EtError``); anything else fails. A crash kills this process, which the
calling test reports. Afterwards a sample of the inputs is replayed several
times under tracemalloc, and with the process's resident size watched, to
find leaks; device paths must give back every byte they allocate.

Usage: python _fuzz_main.py [--scale F] [--seed N]; prints "inputs tried: N".
"""
import argparse
import ctypes
import gc
import math
import os
import random
import sys
import time
import tracemalloc
import warnings

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import etptr
from etptr import EtError, ScalarType, TensorShapeDynamism
from etptr.testing import HostDeviceAllocator, use_allocator

# NumPy before 2.3 lets a numpy.bool_ be an index with a DeprecationWarning (2.3 refuses
# it with TypeError); make_tensor_ptr's integer arguments do not refuse it themselves
# there, so that warning is not an error here.
if np.lib.NumpyVersion(np.__version__) < "2.3.0":
    warnings.filterwarnings("ignore", message="In future, it will be an error for 'np.bool' "
                            "scalars to be interpreted as an index", category=DeprecationWarning)

COUNT = [0]
REPLAY = []            # (body, args) samples for the leak check
REPLAY_PER_BODY = 100
_replayed = {}


# ------------------------------------------------------------------ harness

def call(fn, *args, **kwargs):
    """Call fn: return its result, or None when it raised an etptr exception."""
    COUNT[0] += 1
    try:
        return fn(*args, **kwargs)
    except EtError:
        return None


def record(body, args):
    n = _replayed.get(body, 0)
    if n < REPLAY_PER_BODY:
        _replayed[body] = n + 1
        REPLAY.append((body, args))


def prop(strategy_tuple, examples):
    """Turn ``body(*args)`` into a hypothesis property drawing args from the strategies."""
    def deco(body):
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.tuples(*strategy_tuple))
        def run(args):
            record(body, args)
            body(*args)
        run.body = body
        return run
    return deco


def reference_strides(sizes, dim_order):
    strides = [0] * len(sizes)
    running = 1
    for d in reversed(dim_order):
        strides[d] = running
        running *= max(sizes[d], 1)
    return tuple(strides)


def check_metadata(t, sizes=None):
    """A tensor that was built must obey ExecuTorch's metadata rules."""
    assert isinstance(t, etptr.TensorPtr), type(t)
    n = t.dim()
    assert 0 <= n <= 16
    assert len(t.sizes) == len(t.dim_order) == len(t.strides) == n
    assert sorted(t.dim_order) == list(range(n)), t.dim_order
    assert all(s >= 0 for s in t.sizes)
    assert t.strides == reference_strides(t.sizes, t.dim_order), (t.sizes, t.dim_order, t.strides)
    assert t.numel() == math.prod(t.sizes)
    assert t.nbytes == t.numel() * t.element_size()
    assert t.scalar_type in ScalarType
    if n == 0:
        assert t.shape_dynamism == TensorShapeDynamism.STATIC
    if sizes is not None and len(sizes):
        assert t.sizes == tuple(int(s) for s in sizes)


class Deleter:
    """A deleter that counts its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, address):
        self.calls.append(address)


# ------------------------------------------------------------------ strategies

ODD_VALUES = [1.5, float("nan"), float("inf"), "3", b"3", None, True, False, 3 + 0j,
              np.int8(3), np.uint64(2**64 - 1), np.float32(2.0), np.bool_(True),
              np.str_("x"), np.array(3), np.array([1, 2]), [1], (), object(), Ellipsis]
BIG = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, -2**63, -2**63 - 1, -1, 10**30]

small_ints = st.integers(-3, 7)
any_int = st.one_of(small_ints, st.sampled_from(BIG), st.integers(-2**70, 2**70))
odd = st.sampled_from(ODD_VALUES)
element = st.one_of(small_ints, small_ints, any_int, odd)
# made fresh for each draw (some are unhashable, which hypothesis' sampled_from dislikes)
_ODD_SEQ_MAKERS = [
    lambda: "ab", lambda: b"ab", lambda: 5, lambda: 2.5, lambda: {0: 1}, lambda: {"a": 1},
    lambda: {1, 2}, lambda: np.array(3), lambda: np.array([2, 3]), lambda: np.array([2.0, 3.0]),
    lambda: np.array([[1, 2]]), lambda: range(3), lambda: memoryview(b"\x01\x02"),
    lambda: np.array([2, 3], dtype=np.uint64), lambda: bytearray(b"\x02"),
]
odd_seqs = st.sampled_from(_ODD_SEQ_MAKERS).map(lambda make: make())


def seqs(max_len=18, elements=element):
    return st.one_of(
        st.lists(elements, max_size=max_len),
        st.lists(small_ints.filter(lambda v: v >= 0), max_size=5),
        st.lists(elements, max_size=max_len).map(tuple),
        odd_seqs,
        st.lists(small_ints, max_size=5).map(lambda v: iter(v)),
        st.none(),
    )


def perms(max_n=6):
    return st.integers(0, max_n).flatmap(lambda n: st.permutations(list(range(n))))


dim_orders = st.one_of(seqs(), perms())
strides_s = st.one_of(seqs(), st.lists(st.integers(-2, 40), max_size=6))
# names and NumPy dtypes, good and bad, besides ScalarTypes and codes
TYPE_SPELLINGS = ["Float", "BFloat16", "Float8_e5m2", "QInt8", "UInt64", "float", "half", "",
                  "Flaot", " Float", np.str_("Half"), np.str_("x"), np.float16, np.int64,
                  np.dtype("int32"), np.dtype(np.bool_), ml_dtypes.bfloat16,
                  ml_dtypes.float8_e4m3fn, np.dtype(">f4"), np.longdouble, np.floating,
                  np.generic, np.object_, np.dtype("U3"), np.dtype("i4,f4"), ml_dtypes.int4,
                  float, int, bool, np.bool_(True)]
types = st.one_of(st.sampled_from(list(ScalarType)), st.integers(-3, 40), odd, st.none(),
                  st.sampled_from(BIG), st.sampled_from(TYPE_SPELLINGS))
dynamisms = st.one_of(st.sampled_from(list(TensorShapeDynamism)), st.integers(-2, 5), odd)
DEVICES = ["cpu", "cuda", "cuda:0", "cuda:1", "cuda:-1", "cuda:127", "cuda:128", "cuda:-2",
           "CUDA", " cpu ", "cuda:", "cuda:x", "tpu", "", "cpu:0", "cuda:1:2",
           etptr.Device("cpu"), etptr.Device("cuda", 3), etptr.DeviceType.CUDA,
           etptr.DeviceType.CPU, 0, 1, 2, -1, None, 1.0, b"cpu", np.array([1, 2])]
devices = st.sampled_from(DEVICES)


def mostly(valid, anything):
    """Valid three times in four: the other arguments must pass for a deep check to run."""
    return st.one_of(valid, valid, valid, anything)


ok_order = mostly(st.none(), dim_orders)
ok_strides = mostly(st.none(), strides_s)
ok_dyn = mostly(st.sampled_from(list(TensorShapeDynamism)), dynamisms)
ok_device = mostly(st.just("cpu"), devices)
deleters = st.sampled_from([None, "deleter", 5, "not callable"])

# sizes that never ask for more than a little memory: small valid shapes, or
# shapes that must be refused before anything is allocated
small_sizes = st.lists(st.integers(0, 4), max_size=5)
refused_sizes = st.one_of(
    st.lists(st.integers(-5, -1), min_size=1, max_size=3).map(lambda v: v + [2]),
    st.sampled_from([[2**32, 2**32], [2**62, 4], [2**63 - 1, 2], [2**63], [-2**63],
                     [2**64], [1] * 17, [1] * 40, [3, 2**61, 2**61], [0, -1]]),
    seqs(),
)
alloc_sizes = st.one_of(small_sizes, small_sizes, refused_sizes,
                        st.sampled_from([[2**50], [2**20, 2**35], [2**55, 1]]))  # beyond any address space


def too_big_to_try(sizes):
    """Valid sizes that would really allocate more than 16 MiB (but less than the address
    space): the operating system may grant them, so they are left out."""
    try:
        dims = [int(v) for v in sizes]
    except Exception:
        return False
    if any(v < 0 or isinstance(v, bool) for v in dims) or len(dims) > 16:
        return False
    n = math.prod(dims) * 16
    return 2**24 < n < 2**47

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64,
          np.complex64, np.complex128, np.bool_, np.uint16, np.uint32, np.uint64,
          ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e4m3fnuz, np.longdouble, object,
          np.dtype(">i4"), np.dtype("S3"), np.dtype([("a", "i4"), ("b", "f4")]), np.dtype("U2"),
          np.dtype("M8[s]"), np.dtype("V2")]
SPECIAL = [0, 1, -1, 0.5, -0.5, float("nan"), float("inf"), -float("inf"), 1e300, -1e300,
           255, 256, 65535, 2**31 - 1, -2**31, 2**63 - 1]


ALL_OPS = ["none", "none", "T", "step", "neg", "fortran", "broadcast", "readonly", "offset",
           "many-dims"]


@st.composite
def arrays(draw, max_dim=4, dtypes=DTYPES, ops=ALL_OPS):
    """NumPy arrays of any dtype and layout: sliced, transposed, broadcast, read-only."""
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    shape = draw(st.lists(st.integers(0, 4), max_size=max_dim))
    n = int(np.prod(shape)) if shape else 1
    if dtype.kind in "fc" or dtype in (np.dtype(ml_dtypes.bfloat16),):
        raw = [draw(st.sampled_from(SPECIAL)) for _ in range(min(n, 8))] + [1.0] * max(n - 8, 0)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = np.array(raw, dtype=np.float64).astype(dtype).reshape(shape)
    elif dtype.kind in "iub":
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = (np.arange(n) * 37).astype(dtype).reshape(shape)
    else:
        a = np.zeros(shape, dtype=dtype)
    op = draw(st.sampled_from(ops))
    if op == "T" and a.ndim:
        a = a.T
    elif op == "step" and a.ndim:
        a = a[::2]
    elif op == "neg" and a.ndim:
        a = a[::-1]
    elif op == "fortran":
        a = np.asfortranarray(a)
    elif op == "broadcast":
        a = np.broadcast_to(a, (2,) + a.shape)
    elif op == "readonly":
        a = a.copy()
        a.flags.writeable = False
    elif op == "offset" and a.ndim and a.shape[0] > 1:
        a = a[1:]
    elif op == "many-dims":
        a = a.reshape((1,) * draw(st.integers(14, 20)) + a.shape)[..., None] if a.ndim < 3 else a
    return a


BUFFERS = st.one_of(
    arrays(),
    st.integers(1, 6).map(lambda n: np.array([object() for _ in range(n)], dtype=object)),
    st.binary(max_size=64).map(bytearray),
    st.binary(max_size=64).map(lambda b: memoryview(bytearray(b))),
    st.binary(max_size=64).map(lambda b: memoryview(b)),            # read-only
    st.integers(0, 16).map(lambda n: (ctypes.c_double * n)()),
    st.integers(0, 16).map(lambda n: memoryview(np.zeros(2 * n, np.float32))[::2]),
    st.sampled_from([lambda: memoryview(np.zeros((2, 3), np.int16)).cast("B"), lambda: b"",
                     lambda: "text", lambda: object(),
                     lambda: np.array([1, 2], dtype=object)]).map(lambda make: make()),
)

numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.booleans(), st.sampled_from([np.float16(1.5), np.int8(-3), np.uint64(7),
                                                    np.bool_(False), np.complex64(1j), 3 + 4j,
                                                    np.longdouble(2), np.str_("1"), "1", None]))
# every kind of scalar a caller might pass as a value: Python numbers at and past the
# int64 and double ranges, and one of each NumPy scalar type
SCALAR_ZOO = [10**400, -(10**400), 2**63, 2**64 - 1, -(2**63) - 1, 2**63 - 1, -(2**63), 10**308,
              float("nan"), -0.0, float("inf"), 5e-324, 1e308, True, 3 + 4j]
_NUMPY_SCALAR_MAKERS = [
    lambda: np.str_("1.5"), lambda: np.bytes_(b"2"), lambda: np.datetime64(1, "s"),
    lambda: np.timedelta64(3, "s"), lambda: np.void(b"ab"), lambda: np.complex64(1j),
    lambda: np.complex128(1 + 0j), lambda: np.longdouble("1e4000"), lambda: np.float16("nan"),
    lambda: np.uint64(2**64 - 1), lambda: np.int64(-(2**63)), lambda: np.bool_(True),
    lambda: ml_dtypes.bfloat16(1.5), lambda: np.float32("inf"), lambda: np.int8(-128),
]
scalars = st.one_of(st.sampled_from(SCALAR_ZOO),
                    st.sampled_from(_NUMPY_SCALAR_MAKERS).map(lambda make: make()),
                    st.integers(-2**70, 2**70), st.floats())
value_lists = st.one_of(st.lists(scalars, max_size=4), st.lists(numbers, max_size=8), st.lists(st.integers(-2**65, 2**65), max_size=6),
                        st.lists(st.floats(), max_size=6), st.lists(st.booleans(), max_size=6),
                        st.lists(st.lists(st.integers(), max_size=2), max_size=2))


@st.composite
def tensors(draw, max_dim=4):
    """Valid tensors with real memory (or null data), any scalar type that has a dtype."""
    kind = draw(st.sampled_from(["array", "array", "zeros", "null", "view", "scalar"]))
    dyn = draw(st.sampled_from(list(TensorShapeDynamism)))
    if kind == "array":
        a = draw(arrays(max_dim, DTYPES[:19], ["none", "T", "fortran", "readonly", "offset"]))
        a = np.ascontiguousarray(a) if not a.flags.c_contiguous else a
        order = draw(st.permutations(list(range(a.ndim))))
        b = np.ascontiguousarray(a.transpose(order)).transpose(np.argsort(order)) if a.ndim else a
        return etptr.make_tensor_ptr(b, dynamism=dyn) if b.ndim else etptr.make_tensor_ptr(b)
    if kind == "zeros":
        # zero bytes of any type (zeros() fills only the types ExecuTorch's full fills)
        st_ = draw(st.sampled_from(list(ScalarType)))
        t = etptr.empty(draw(small_sizes), st_, dyn)
        if t.nbytes:
            ctypes.memset(t.data_ptr, 0, t.nbytes)
        return t
    if kind == "null":
        return etptr.make_tensor_ptr(draw(small_sizes), None, type=draw(st.sampled_from(list(ScalarType))),
                                     dynamism=dyn)
    if kind == "scalar":
        return etptr.make_tensor_ptr(draw(st.sampled_from([1.5, 2, True, float("nan")])))
    src = etptr.make_tensor_ptr(np.arange(24, dtype=np.float32))
    sizes = draw(st.sampled_from([[2, 3], [4, 6], [24], [1, 2, 3], [3, 8]]))
    order = draw(st.sampled_from([None, list(range(len(sizes)))[::-1]]))
    return etptr.make_tensor_ptr(src, sizes, dim_order=order)


def resolve_deleter(d):
    return Deleter() if d == "deleter" else d


# ------------------------------------------------------------------ properties

def _raw(sizes, data, dim_order, strides, type_, dyn, deleter, device):
    d = resolve_deleter(deleter)
    t = call(etptr.make_tensor_ptr, sizes, data, dim_order, strides, type_, dyn, d, device)
    if t is not None:
        check_metadata(t, sizes)
        if isinstance(d, Deleter):
            addr = t.data_ptr
            del t
            assert d.calls == [addr], d.calls
    elif isinstance(d, Deleter):
        assert d.calls == [], "a deleter ran although construction failed"


addresses = st.one_of(st.none(), st.integers(-2**65, 2**65), st.sampled_from(
    [0, 8, 2**64 - 1, 2**64, -1, np.uint64(4096), np.int64(-8), True, 1.5, np.bool_(True)]))


def fuzz_raw(n):
    return prop((st.one_of(small_sizes, seqs()), addresses, ok_order, ok_strides, types, ok_dyn,
                 deleters, ok_device), n)(_raw)


def _bytes(sizes, data, dim_order, strides, type_, dyn, deleter, device):
    t = call(etptr.make_tensor_ptr, sizes, data, dim_order, strides, type_, dyn,
             resolve_deleter(deleter), device)
    if t is not None:
        check_metadata(t, sizes)
        if t.device.is_cpu():
            assert bytes(_raw_bytes(t)) == data


def fuzz_bytes(n):
    return prop((st.one_of(small_sizes, seqs()), st.binary(max_size=40), ok_order, ok_strides,
                 types, ok_dyn, st.sampled_from([None, None, "deleter"]), ok_device), n)(_bytes)


def _list(sizes, values, dim_order, strides, type_, dyn, device):
    t = call(etptr.make_tensor_ptr, sizes, values, dim_order, strides, type_, dyn, None, device)
    if t is not None:
        check_metadata(t, sizes)
        assert t.numel() == len(values)


def fuzz_list(n):
    return prop((st.one_of(st.lists(st.integers(0, 8), max_size=3), seqs()), value_lists,
                 ok_order, ok_strides, types, ok_dyn, ok_device), n)(_list)


def _buffer(sizes, buf, dim_order, strides, type_, dyn, deleter, device):
    d = resolve_deleter(deleter)
    t = call(etptr.make_tensor_ptr, sizes, buf, dim_order, strides, type_, dyn, d, device)
    if t is not None:
        check_metadata(t, sizes)
        if isinstance(buf, np.ndarray):
            nbytes, readonly = buf.nbytes, not buf.flags.writeable
        else:
            with memoryview(buf) as mv:
                nbytes, readonly = mv.nbytes, mv.readonly
        assert t.nbytes <= nbytes
        assert t.readonly == (readonly and not isinstance(buf, bytes))   # bytes: a copy
        if t.device.is_cpu() and t.numel():
            try:
                view = t.numpy()
            except EtError:
                view = None
            if view is not None:
                assert view.flags.writeable == (not readonly)
            view = None                                  # it keeps t alive
        if t.device.is_cpu() and not t.readonly and t.nbytes:
            # a writable tensor's memory may be written with anything without harm
            ctypes.memset(t.data_ptr, 0x41, t.nbytes)
        if isinstance(d, Deleter):
            del t
            assert len(d.calls) == 1
    elif isinstance(d, Deleter):
        assert d.calls == []


def fuzz_buffer(n):
    return prop((st.one_of(small_sizes, seqs()), BUFFERS, ok_order, ok_strides,
                 st.one_of(st.none(), st.sampled_from(list(ScalarType)), types), ok_dyn,
                 deleters, ok_device), n)(_buffer)


def _short(x, type_, dyn, device, extra):
    kwargs = {} if extra is None else {extra: None if extra == "deleter" else [0]}
    if type_ is not None:
        kwargs["type"] = type_
    t = call(etptr.make_tensor_ptr, x, dynamism=dyn, device=device, **kwargs)
    if t is not None:
        check_metadata(t)
        if isinstance(x, np.ndarray) and t.device.is_cpu() and x.size and type_ is None:
            assert t.sizes == x.shape and t.numpy().tobytes() == x.tobytes()


def fuzz_short(n):
    return prop((st.one_of(arrays(), value_lists, numbers, odd, odd_seqs),
                 st.one_of(st.none(), st.none(), types), dynamisms,
                 st.sampled_from(["cpu", "cpu", "cuda", "tpu", None]),
                 st.sampled_from([None, None, "deleter", "dim_order", "strides"])), n)(_short)


def _view(src, sizes, dim_order, strides, deleter, device, type_):
    d = resolve_deleter(deleter)
    kwargs = dict(dim_order=dim_order, strides=strides, deleter=d, device=device)
    if type_ is not None:
        kwargs["type"] = type_
    args = (src,) if isinstance(sizes, str) and sizes == "omit" else (src, sizes)
    t = call(etptr.make_tensor_ptr, *args, **kwargs)
    if t is not None:
        check_metadata(t)
        assert t.numel() <= src.numel()
        assert t.data_ptr == src.data_ptr and t.scalar_type == src.scalar_type
        assert t.readonly == src.readonly
        if isinstance(d, Deleter):
            del t
            assert len(d.calls) == 1
    elif isinstance(d, Deleter):
        assert d.calls == []


def fuzz_view(n):
    return prop((tensors(), st.one_of(st.just("omit"), seqs(), small_sizes), dim_orders,
                 strides_s, st.sampled_from([None, None, "deleter", 3]),
                 st.sampled_from([None, None, "cpu", "cuda:2", "bogus", 7, np.array([1, 2])]),
                 st.sampled_from([None, None, None, ScalarType.Int])), n)(_view)


def _resize(src, sizes):
    before = (src.sizes, src.dim_order, src.strides, src.numel())
    r = call(etptr.resize_tensor_ptr, src, sizes)
    check_metadata(src)
    if r is None and (src.sizes, src.dim_order, src.strides, src.numel()) != before:
        # it worked: the new sizes, same dim_order, strides recomputed
        assert src.sizes == tuple(int(s) for s in sizes)
        assert src.dim_order == before[1]
    call(etptr.resize_tensor_ptr, sizes, src)      # arguments swapped: wrong types


def fuzz_resize(n):
    return prop((tensors(), st.one_of(small_sizes, seqs(), st.lists(st.integers(0, 30), max_size=4))),
                n)(_resize)


def spelled(type_):
    """The ScalarType a type= spelling means (None for None or a refused spelling)."""
    if type_ is None:
        return None
    try:
        return etptr.empty([0], type=type_).scalar_type
    except EtError:
        return None


def _clone(src, type_):
    t = call(etptr.clone_tensor_ptr, src, type_)
    if t is not None:
        check_metadata(t)
        assert (t.sizes, t.dim_order, t.strides) == (src.sizes, src.dim_order, src.strides)
        type_ = spelled(type_)
        if type_ is None or type_ == src.scalar_type:
            assert t.scalar_type == src.scalar_type
            if src.data_ptr and src.numel():
                assert t.data_ptr != src.data_ptr
                assert bytes(np.frombuffer(_raw_bytes(t), np.uint8)) == bytes(np.frombuffer(_raw_bytes(src), np.uint8))
        else:
            assert t.scalar_type == type_
    call(etptr.clone_tensor_ptr, type_, src)       # arguments swapped: wrong types


def _raw_bytes(t):
    return (ctypes.c_char * t.nbytes).from_address(t.data_ptr) if t.nbytes else b""


def fuzz_clone(n):
    return prop((tensors(), st.one_of(st.sampled_from(list(ScalarType)), types)), n)(_clone)


def _values(value, type_, sizes, dyn):
    t = call(etptr.full, sizes, value, type_, dyn)
    if t is not None:
        check_metadata(t, sizes)
    call(etptr.scalar_tensor, value, type_)
    t = call(etptr.make_tensor_ptr, value, type=type_)
    if t is not None:
        check_metadata(t)
    call(etptr.make_tensor_ptr, [1.5, value], type=type_)
    call(etptr.make_tensor_ptr, [2], [value, value], type=type_)


def fuzz_values(n):
    return prop((scalars, st.one_of(st.none(), st.sampled_from(list(ScalarType))),
                 st.sampled_from([[2], [], [0], [1, 3]]), st.sampled_from([0, 1, 2])),
                n)(_values)


MAKERS = ["empty", "empty_strided", "full", "full_strided", "zeros", "ones", "rand",
          "rand_strided", "randn", "randn_strided", "randint", "randint_strided",
          "scalar_tensor", "empty_like", "full_like", "zeros_like", "ones_like", "rand_like",
          "randn_like", "randint_like", "for_blob", "from_blob"]
fill_values = st.one_of(numbers, st.sampled_from(SPECIAL), odd, scalars)
bounds = st.one_of(st.integers(-10, 10), st.sampled_from(BIG), odd)


def _maker(name, sizes, strides, type_, dyn, device, fill, low, high, other, blob, setters):
    if name not in ("for_blob", "from_blob") and too_big_to_try(sizes):
        return
    kw = dict(dynamism=dyn, device=device)
    f = getattr(etptr, name)
    if name in ("empty", "zeros", "ones", "rand", "randn"):
        t = call(f, sizes, type_, **kw)
    elif name in ("empty_strided", "rand_strided", "randn_strided"):
        t = call(f, sizes, strides, type_, **kw)
    elif name == "full":
        t = call(f, sizes, fill, type_, **kw)
    elif name == "full_strided":
        t = call(f, sizes, strides, fill, type_, **kw)
    elif name == "scalar_tensor":
        t = call(f, fill, type_, **kw)
    elif name == "randint":
        t = call(f, low, high, sizes, type_, **kw)
    elif name == "randint_strided":
        t = call(f, low, high, sizes, strides, type_, **kw)
    elif name == "full_like":
        t = call(f, other, fill, type_, **kw)
    elif name == "randint_like":
        t = call(f, other, low, high, type_, **kw)
    elif name.endswith("_like"):
        t = call(f, other, type_, **kw)
    elif name == "from_blob":
        t = call(f, blob, sizes, type_, strides=strides, dynamism=dyn, device=device)
    else:   # for_blob: a builder, each setter with a drawn value
        b = call(f, blob, sizes, type_)
        t = None
        if b is not None:
            for setter, value in setters:
                if call(getattr(b, setter), value) is None:
                    break
            t = call(b.make_tensor_ptr)
    if t is not None:
        check_metadata(t)
        if name not in ("for_blob", "from_blob") and not isinstance(other, str) and t.device.is_cpu() \
                and name.startswith(("zeros", "ones")) and t.numel() and t.scalar_type not in (
                    ScalarType.ComplexHalf,) and t.element_size() <= 16:
            try:
                v = t.numpy()
            except EtError:
                v = None
            if v is not None and name.startswith("zeros"):
                assert not any(bytes(_raw_bytes(t)))


SETTERS = st.lists(st.tuples(st.sampled_from(["type", "dim_order", "strides", "dynamism",
                                              "deleter", "device"]),
                             st.one_of(seqs(), types, devices, st.sampled_from([print, 5]))),
                   max_size=3)


def fuzz_makers(n):
    return prop((st.sampled_from(MAKERS), alloc_sizes, st.one_of(strides_s, st.none()),
                 st.one_of(st.sampled_from(list(ScalarType)), types), dynamisms,
                 st.sampled_from(["cpu", "cpu", "cpu", "cuda", "cuda:1", "cuda:-1", "tpu", None, 3]),
                 fill_values, bounds, bounds,
                 st.one_of(tensors(), st.sampled_from([None, 5, "t", np.zeros(2)])),
                 st.one_of(addresses, BUFFERS), SETTERS), n)(_maker)


def _device(src, device, back, fail_after, maker_sizes, type_):
    if too_big_to_try(maker_sizes):
        maker_sizes = [2, 2]
    alloc = HostDeviceAllocator()
    alloc.fail_after = fail_after
    with use_allocator(alloc):
        d = call(etptr.clone_tensor_ptr_to, src, device)
        if d is not None:
            check_metadata(d)
            assert d.device.type == etptr.DeviceType.CUDA and d.device.index >= 0
            h = call(etptr.clone_tensor_ptr_to, d, back)
            if h is not None:
                check_metadata(h)
                if src.data_ptr and src.numel():
                    assert bytes(_raw_bytes(h)) == bytes(_raw_bytes(src))
            call(etptr.clone_tensor_ptr, d)                      # refused: on a device
            call(etptr.clone_tensor_ptr_to, d, "cuda")          # device -> device refused
            call(etptr.clone_tensor_ptr_to_cpu, d)
            call(etptr.make_tensor_ptr, d, [1] * d.dim() if d.numel() else None)
            del d, h
        call(etptr.clone_tensor_ptr_to_device, src, device, None)
        call(etptr.clone_tensor_ptr_to_device, src, "cuda", device)
        call(etptr.zeros, maker_sizes, type_, device=device)
        call(etptr.full, maker_sizes, 7, type_, device=device)
        call(etptr.empty, maker_sizes, type_, device=device)
        call(etptr.make_tensor_ptr, maker_sizes, [1.0] * 4, type=type_, device=device)
        call(etptr.from_dlpack, src, device=device)
    gc.collect()
    assert alloc.live_bytes == 0, f"device memory leaked: {alloc.live_bytes} bytes"
    assert alloc.allocate_count == alloc.deallocate_count, (alloc.allocate_count, alloc.deallocate_count)


def fuzz_device(n):
    return prop((tensors(), devices, st.sampled_from(["cpu", "cpu", "cuda", None, 5]),
                 st.sampled_from([None, None, 0, 1, 2]), alloc_sizes,
                 st.one_of(st.sampled_from(list(ScalarType)), types)), n)(_device)


def _dlpack(a, copy, device, wrap):
    alloc = HostDeviceAllocator()
    with use_allocator(alloc):
        obj = a
        back = None
        if wrap == "capsule" and isinstance(a, np.ndarray):
            try:
                obj = a.__dlpack__(max_version=(1, 1))      # NumPy's, not etptr's, refusal
            except BufferError:
                obj = a
        t = call(etptr.from_dlpack, obj, copy=copy, device=device)
        if t is not None:
            check_metadata(t)
            if isinstance(a, np.ndarray) and t.device.is_cpu() and a.size:
                np.testing.assert_array_equal(t.numpy(), a)
                if copy is True:
                    assert not t.readonly
                elif not a.flags.writeable:
                    assert t.readonly
            back = call(etptr.from_dlpack, t)
            if back is not None:
                assert back.data_ptr == t.data_ptr
        del t, obj, back
    gc.collect()
    assert alloc.live_bytes == 0, f"device memory leaked: {alloc.live_bytes} bytes"


def fuzz_dlpack(n):
    return prop((st.one_of(arrays(dtypes=DTYPES[:14] + [np.longdouble, object]),
                           st.sampled_from([5, "x", None, b"", memoryview(b"ab")])),
                 st.sampled_from([None, None, True, False, 1, "yes"]),
                 st.sampled_from([None, None, None, "cpu", "cuda", "cuda:1", "tpu", 3]),
                 st.sampled_from(["direct", "direct", "capsule"])), n)(_dlpack)


class CAI:
    def __init__(self, d):
        self.__cuda_array_interface__ = d


cai_fields = st.fixed_dictionaries({}, optional={
    "shape": st.one_of(seqs(6), small_sizes.map(tuple)),
    "typestr": st.one_of(st.sampled_from(["<f4", "<f8", "|u1", "<i8", "|b1", "<c8", ">f4", "<V2",
                                          "zz", "<f2", "<u8", "|i1", "<M8[s]", "O"]), odd),
    "data": st.one_of(st.tuples(st.one_of(st.integers(-5, 2**64 + 5), odd), st.one_of(st.booleans(), odd)),
                      odd, st.lists(st.integers(), max_size=3)),
    "strides": st.one_of(st.none(), seqs(6), st.lists(st.integers(-16, 64), max_size=4).map(tuple)),
    "version": st.one_of(st.integers(-1, 5), odd),
    "mask": st.sampled_from([None, None, object()]),
    "stream": st.sampled_from([None, None, 0, "s", 1.5]),
})


def _cai(fields, device, shape_first):
    if shape_first and "shape" not in fields:
        fields = dict(fields, shape=(2, 3), typestr="<f4", data=(4096, False))
    t = call(etptr.from_cuda_array_interface, CAI(fields), device=device)
    if t is not None:
        check_metadata(t)
    call(etptr.from_cuda_array_interface, fields)                # a dict is no CAI object


def fuzz_cai(n):
    return prop((cai_fields, st.sampled_from(["cuda", "cuda:3", "cpu", "bogus", 7]),
                 st.booleans()), n)(_cai)


PROPERTIES = [
    ("make_tensor_ptr(sizes, address)", fuzz_raw, 1200),
    ("make_tensor_ptr(sizes, bytes)", fuzz_bytes, 500),
    ("make_tensor_ptr(sizes, list)", fuzz_list, 700),
    ("make_tensor_ptr(sizes, buffer)", fuzz_buffer, 900),
    ("make_tensor_ptr(x) short forms", fuzz_short, 700),
    ("alias views", fuzz_view, 600),
    ("resize_tensor_ptr", fuzz_resize, 450),
    ("clone_tensor_ptr", fuzz_clone, 500),
    ("scalar values (full, scalar_tensor, lists)", fuzz_values, 300),
    ("makers", fuzz_makers, 1000),
    ("device clones (HostDeviceAllocator)", fuzz_device, 250),
    ("from_dlpack", fuzz_dlpack, 300),
    ("from_cuda_array_interface", fuzz_cai, 400),
]


# ------------------------------------------------------------------ leak check

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def replay_once():
    for body, args in REPLAY:
        body(*args)


def leak_check(rounds):
    replay_once()                      # warm caches (ml_dtypes, numpy, interned strings)
    gc.collect()
    tracemalloc.start(1)
    replay_once()
    gc.collect()
    traced0 = tracemalloc.get_traced_memory()[0]
    snap0 = tracemalloc.take_snapshot()
    rss0 = rss_bytes()
    for _ in range(rounds):
        replay_once()
    gc.collect()
    traced1 = tracemalloc.get_traced_memory()[0]
    snap1 = tracemalloc.take_snapshot()
    rss1 = rss_bytes()
    tracemalloc.stop()
    growth = traced1 - traced0
    print(f"leak check: {len(REPLAY)} inputs x {rounds} rounds: traced memory "
          f"{growth:+d} bytes, resident size {rss1 - rss0:+d} bytes")
    if growth > 64 * 1024:
        for stat in snap1.compare_to(snap0, "traceback")[:5]:
            print(stat)
            for line in stat.traceback.format()[-8:]:
                print("   ", line)
        raise AssertionError(f"traced memory grew by {growth} bytes over {rounds} replays")
    if rss1 - rss0 > 16 * 2**20:
        raise AssertionError(f"resident size grew by {rss1 - rss0} bytes over {rounds} replays")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every example count")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3, help="replays for the leak check")
    ap.add_argument("--only", default="", help="run the properties whose name contains this")
    ap.add_argument("--keep-going", action="store_true",
                    help="report every failing property instead of stopping at the first")
    args = ap.parse_args()
    s = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"seed: {s}", flush=True)
    t0 = time.perf_counter()
    failed = []
    for name, make, n in PROPERTIES:
        if args.only not in name:
            continue
        before = COUNT[0]
        t1 = time.perf_counter()
        run = seed(s)(make(max(1, int(n * args.scale))))
        try:
            run()
        except Exception:
            if not args.keep_going:
                raise
            import traceback
            traceback.print_exc()
            failed.append(name)
        print(f"  {name}: {COUNT[0] - before} inputs in {time.perf_counter() - t1:.1f} s", flush=True)
    print(f"inputs tried: {COUNT[0]} in {time.perf_counter() - t0:.1f} s", flush=True)
    if failed:
        print(f"failing properties: {failed}", flush=True)
        sys.exit(1)
    leak_check(args.rounds)
    print("fuzz: ok", flush=True)


if __name__ == "__main__":
    main()
