"""Metadata paths: the make_tensor_ptr overloads, views, resize, stride computation and
host clones (``clone_tensor_ptr`` with and without casts).

``make_tensor_ptr(ndarray)`` is grouped with ``torch.from_numpy`` per shape, so
the two compare side by side when torch is importable (DESIGN.md's goal).
Each benchmark checks its result once, outside the timing.
"""
import itertools

import numpy as np
import pytest

import etptr
from etptr import ScalarType

SHAPES = {
    "0d": (),
    "1d-1024": (1024,),
    "2d-384x384": (384, 384),
    "4d-8x16x32x64": (8, 16, 32, 64),
}


# ------------------------------------------------------------------ wrapping ndarrays

@pytest.mark.parametrize("name, shape", SHAPES.items(), ids=SHAPES.keys())
def test_make_tensor_ptr_ndarray(benchmark, name, shape):
    benchmark.group = f"wrap ndarray {name}"
    a = np.zeros(shape, np.float32)
    t = benchmark(etptr.make_tensor_ptr, a)
    assert t.sizes == shape and t.data_ptr == a.ctypes.data


@pytest.mark.parametrize("name, shape", SHAPES.items(), ids=SHAPES.keys())
def test_torch_from_numpy(benchmark, torch_module, name, shape):
    benchmark.group = f"wrap ndarray {name}"
    a = np.zeros(shape, np.float32)
    t = benchmark(torch_module.from_numpy, a)
    assert tuple(t.shape) == shape and t.data_ptr() == a.ctypes.data


# ------------------------------------------------------------------ other overloads

@pytest.mark.benchmark(group="make_tensor_ptr overloads")
def test_make_tensor_ptr_address(benchmark):
    a = np.zeros((384, 384), np.float32)
    t = benchmark(etptr.make_tensor_ptr, [384, 384], a.ctypes.data, type=ScalarType.Float)
    assert t.data_ptr == a.ctypes.data and t.strides == (384, 1)


@pytest.mark.benchmark(group="make_tensor_ptr overloads")
def test_make_tensor_ptr_buffer_with_sizes(benchmark):
    buf = bytearray(384 * 384 * 4)
    t = benchmark(etptr.make_tensor_ptr, [384, 384], buf, type=ScalarType.Float)
    assert t.numel() == 384 * 384


@pytest.mark.benchmark(group="make_tensor_ptr overloads")
@pytest.mark.parametrize("n", [16, 1024])
def test_make_tensor_ptr_float_list(benchmark, n):
    values = [float(i) for i in range(n)]
    t = benchmark(etptr.make_tensor_ptr, values)
    assert t.sizes == (n,) and t.scalar_type == ScalarType.Float


@pytest.mark.benchmark(group="make_tensor_ptr overloads")
def test_make_tensor_ptr_int_list_cast(benchmark):
    values = list(range(1024))
    t = benchmark(etptr.make_tensor_ptr, [32, 32], values, type=ScalarType.Int)
    assert t.scalar_type == ScalarType.Int and t.numpy()[31, 31] == 1023


@pytest.mark.benchmark(group="make_tensor_ptr overloads")
def test_make_tensor_ptr_bytes(benchmark):
    data = bytes(64 * 64 * 4)
    t = benchmark(etptr.make_tensor_ptr, [64, 64], data, type=ScalarType.Float)
    assert t.nbytes == len(data)


@pytest.mark.benchmark(group="make_tensor_ptr overloads")
def test_make_tensor_ptr_scalar(benchmark):
    t = benchmark(etptr.make_tensor_ptr, 3.5)
    assert t.sizes == () and t.numpy() == 3.5


# ------------------------------------------------------------------ views

@pytest.fixture
def matrix():
    return etptr.make_tensor_ptr(np.zeros((384, 1536), np.float32))


@pytest.mark.benchmark(group="views")
def test_view_same_sizes(benchmark, matrix):
    v = benchmark(etptr.make_tensor_ptr, matrix)
    assert v.data_ptr == matrix.data_ptr and v.sizes == matrix.sizes


@pytest.mark.benchmark(group="views")
def test_view_flat(benchmark, matrix):
    v = benchmark(etptr.make_tensor_ptr, matrix, [384 * 1536])
    assert v.sizes == (384 * 1536,) and v.strides == (1,)


@pytest.mark.benchmark(group="views")
def test_view_reshape(benchmark, matrix):
    v = benchmark(etptr.make_tensor_ptr, matrix, [6, 64, 1536])
    assert v.strides == (64 * 1536, 1536, 1)


@pytest.mark.benchmark(group="views")
def test_view_transposed_dim_order(benchmark, matrix):
    v = benchmark(etptr.make_tensor_ptr, matrix, [1536, 384], dim_order=[1, 0])
    assert v.strides == (1, 1536)


# ------------------------------------------------------------------ resize

@pytest.mark.benchmark(group="resize")
@pytest.mark.parametrize("rank", [1, 4])
def test_resize_tensor_ptr(benchmark, rank):
    full = [64] * rank
    t = etptr.make_tensor_ptr(np.zeros(full, np.float32))
    sizes = [[32] + full[1:], full]
    next_sizes = itertools.cycle(sizes).__next__

    def resize():  # alternate shrinking and growing back within the bound
        etptr.resize_tensor_ptr(t, next_sizes())

    benchmark(resize)
    assert t.sizes in (tuple(sizes[0]), tuple(sizes[1]))


# ------------------------------------------------------------------ stride computation

STRIDE_CASES = {
    "4d-contiguous": ([8, 16, 32, 64], None),
    "4d-channels-last": ([8, 16, 32, 64], [0, 2, 3, 1]),
    "16d-contiguous": ([2] * 16, None),
    "16d-reversed": ([2] * 16, list(range(15, -1, -1))),
}


@pytest.mark.benchmark(group="strides from dim_order")
@pytest.mark.parametrize("sizes, dim_order", STRIDE_CASES.values(), ids=STRIDE_CASES.keys())
def test_strides_from_dim_order(benchmark, sizes, dim_order):
    t = benchmark(etptr.make_tensor_ptr, sizes, None, dim_order=dim_order)
    order = dim_order or list(range(len(sizes)))
    expected, step = [0] * len(sizes), 1
    for d in reversed(order):
        expected[d] = step
        step *= sizes[d]
    assert t.strides == tuple(expected)


@pytest.mark.benchmark(group="strides given, checked")
@pytest.mark.parametrize("rank", [4, 16])
def test_given_strides_checked(benchmark, rank):
    sizes = [2] * rank
    strides = [1 << (rank - 1 - d) for d in range(rank)]
    t = benchmark(etptr.make_tensor_ptr, sizes, None, strides=strides)
    assert t.strides == tuple(strides) and t.dim_order == tuple(range(rank))


# ------------------------------------------------------------------ host clones

CLONE_BYTES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20}


@pytest.mark.parametrize("name, nbytes", CLONE_BYTES.items(), ids=CLONE_BYTES.keys())
def test_clone_tensor_ptr(benchmark, throughput, name, nbytes):
    benchmark.group = f"host copy {name}"
    src = etptr.make_tensor_ptr(np.arange(nbytes // 4, dtype=np.float32))
    out = benchmark(etptr.clone_tensor_ptr, src)
    throughput(nbytes)
    assert out.data_ptr != src.data_ptr and np.array_equal(out.numpy(), src.numpy())


@pytest.mark.parametrize("name, nbytes", CLONE_BYTES.items(), ids=CLONE_BYTES.keys())
def test_numpy_copy(benchmark, throughput, name, nbytes):
    benchmark.group = f"host copy {name}"
    a = np.arange(nbytes // 4, dtype=np.float32)
    benchmark(a.copy)
    throughput(nbytes)


CASTS = {
    "Float-Double": (np.float32, ScalarType.Double),
    "Float-Half": (np.float32, ScalarType.Half),
    "Float-BFloat16": (np.float32, ScalarType.BFloat16),
    "Int-Long": (np.int32, ScalarType.Long),
    "Long-Float": (np.int64, ScalarType.Float),
    "Bool-Byte": (np.bool_, ScalarType.Byte),
}


@pytest.mark.benchmark(group="clone_tensor_ptr cast 1 MiB source")
@pytest.mark.parametrize("src_dtype, target", CASTS.values(), ids=CASTS.keys())
def test_clone_tensor_ptr_cast(benchmark, throughput, src_dtype, target):
    nbytes = 1 << 20
    a = (np.arange(nbytes // np.dtype(src_dtype).itemsize) % 100).astype(src_dtype)
    src = etptr.make_tensor_ptr(a)
    out = benchmark(etptr.clone_tensor_ptr, src, target)
    throughput(nbytes)
    assert out.scalar_type == target and out.sizes == src.sizes
    assert np.array_equal(out.numpy().astype(np.float64), a.astype(np.float64))
