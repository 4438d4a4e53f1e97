"""Helpers shared by the checkpoint tests: raw safetensors files, reference data, fd counts."""
import json
import os

import ml_dtypes
import numpy as np

from etptr import ScalarType

# safetensors dtype name -> (ScalarType, numpy dtype) for every dtype etptr supports
DTYPES = {
    "F64": (ScalarType.Double, np.dtype(np.float64)),
    "F32": (ScalarType.Float, np.dtype(np.float32)),
    "F16": (ScalarType.Half, np.dtype(np.float16)),
    "BF16": (ScalarType.BFloat16, np.dtype(ml_dtypes.bfloat16)),
    "I64": (ScalarType.Long, np.dtype(np.int64)),
    "I32": (ScalarType.Int, np.dtype(np.int32)),
    "I16": (ScalarType.Short, np.dtype(np.int16)),
    "I8": (ScalarType.Char, np.dtype(np.int8)),
    "U8": (ScalarType.Byte, np.dtype(np.uint8)),
    "U16": (ScalarType.UInt16, np.dtype(np.uint16)),
    "U32": (ScalarType.UInt32, np.dtype(np.uint32)),
    "U64": (ScalarType.UInt64, np.dtype(np.uint64)),
    "BOOL": (ScalarType.Bool, np.dtype(np.bool_)),
    "F8_E4M3": (ScalarType.Float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn)),
    "F8_E5M2": (ScalarType.Float8_e5m2, np.dtype(ml_dtypes.float8_e5m2)),
}
# the dtypes safetensors.numpy can save and load itself
NUMPY_DTYPES = [k for k in DTYPES if k not in ("BF16", "F8_E4M3", "F8_E5M2")]
# safetensors' constructor-style names for its serialize() TensorSpec
SPEC_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16",
    "U32": "uint32", "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def random_array(code, shape, rng):
    """Random elements of dtype ``code``: every bit pattern for the float types
    (NaNs too), 0/1 for BOOL."""
    dt = DTYPES[code][1]
    n = int(np.prod(shape, dtype=np.int64))
    if code == "BOOL":
        return (rng.integers(0, 2, n, dtype=np.uint8) == 1).reshape(shape)
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def raw_bytes(arr):
    """The bytes of an array in C order."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8).tobytes()


def code_of(dtype):
    """The safetensors dtype name of a numpy dtype."""
    for code, (_, dt) in DTYPES.items():
        if dt == np.dtype(dtype):
            return code
    raise KeyError(dtype)


def reference_serialize(arrays, metadata=None):
    """File bytes written by the safetensors library itself (any supported dtype)."""
    from safetensors import TensorSpec, serialize

    keep = {k: np.array(a, order="C", copy=True) for k, a in arrays.items()}
    specs = {k: TensorSpec(dtype=SPEC_NAMES[code_of(a.dtype)], shape=list(a.shape),
                           data_ptr=a.ctypes.data, data_len=a.nbytes)
             for k, a in keep.items()}
    return serialize(specs, metadata=metadata)


def reference_read(path):
    """``{name: (dtype code, shape tuple, bytes)}`` as the safetensors library reads the file."""
    from safetensors import deserialize

    with open(path, "rb") as f:
        content = f.read()
    return {name: (info["dtype"], tuple(info["shape"]), bytes(info["data"]))
            for name, info in deserialize(content)}


def write_raw(path, header, data=b"", *, length=None, pad=True):
    """A file with an arbitrary header: a dict/list (dumped as JSON), str or bytes.

    ``length`` overrides the 8-byte header length; ``pad`` pads the JSON with
    spaces to a multiple of 8 as the format's writer does.
    """
    if isinstance(header, (dict, list)):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * (-len(header) % 8)
    n = len(header) if length is None else length
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little") + header + data)
    return path


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def tiny_bert(transformers, torch, seed):
    """A two-layer BERT of hidden size 32 (random weights from ``seed``), warnings off."""
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=37)
    torch.manual_seed(seed)
    return transformers.BertModel(config)
