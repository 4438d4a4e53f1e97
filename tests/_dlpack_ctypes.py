"""A DLPack producer written with ctypes, for tests: every field of the capsule is set by hand.

Real producers (NumPy, CuPy, torch) never hand out byte offsets, NULL strides,
unknown type codes or DLPack 2.x capsules on request; this one does, so the
importer's handling of them can be tested. The producer keeps every capsule it
hands out and has no capsule destructor (a Python one would run while the
importer's exception is pending); :meth:`HandMadeProducer.settle` does what a
real producer's destructor does, running the deleter of every capsule a
consumer did not rename to ``used_dltensor*``. The deleter counts its calls,
so a test sees whether it ran exactly once in all.
"""
import ctypes
from ctypes import (
    CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_uint8, c_uint16,
    c_uint32, c_uint64, c_void_p, py_object)

import numpy as np


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


DELETER = CFUNCTYPE(None, c_void_p)


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DELETER)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", DELETER),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = py_object
_api.PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]
_api.PyCapsule_IsValid.restype = c_int
_api.PyCapsule_IsValid.argtypes = [py_object, c_char_p]

_VERSIONED = b"dltensor_versioned"
_LEGACY = b"dltensor"


class HandMadeProducer:
    """A DLPack producer over ``buf`` (a NumPy array or None) with every field chosen.

    ``deleted`` counts deleter calls; ``requests`` records the keyword arguments
    of each ``__dlpack__`` call. ``legacy=True`` makes ``__dlpack__`` refuse
    ``max_version`` with TypeError, as pre-1.0 producers do.
    """

    def __init__(self, buf, shape, strides=None, *, code=2, bits=32, lanes=1,
                 device=(1, 0), byte_offset=0, flags=0, version=(1, 1), legacy=False,
                 data=None, ndim=None, null_shape=False, dlpack_device=None):
        self.buf = buf
        self.shape = (c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (c_int64 * max(len(strides), 1))(*strides)
        self.fields = dict(code=code, bits=bits, lanes=lanes, device=device,
                           byte_offset=byte_offset, flags=flags, version=version,
                           ndim=len(shape) if ndim is None else ndim, null_shape=null_shape)
        if data is None and buf is not None:
            data = buf.ctypes.data
        self.data = data
        self.legacy = legacy
        self.dlpack_device = device if dlpack_device is None else dlpack_device
        self.deleted = 0
        self.requests = []
        self._structs = []
        self._capsules = []

        def on_delete(address):
            self.deleted += 1

        self._deleter = DELETER(on_delete)

    def _fill(self, dl):
        f = self.fields
        dl.data = self.data
        dl.device.device_type, dl.device.device_id = f["device"]
        dl.ndim = f["ndim"]
        dl.dtype.code, dl.dtype.bits, dl.dtype.lanes = f["code"], f["bits"], f["lanes"]
        dl.shape = None if f["null_shape"] else self.shape
        dl.strides = self.strides
        dl.byte_offset = f["byte_offset"]

    def capsule(self, versioned=True):
        if versioned:
            m = DLManagedTensorVersioned()
            m.version.major, m.version.minor = self.fields["version"]
            m.flags = self.fields["flags"]
            name = _VERSIONED
        else:
            m = DLManagedTensor()
            name = _LEGACY
        self._fill(m.dl_tensor)
        m.deleter = self._deleter
        self._structs.append(m)
        cap = _api.PyCapsule_New(ctypes.addressof(m), name, None)
        self._capsules.append((cap, name, m))
        return cap

    def settle(self):
        """Run the deleter of each capsule not consumed, as a capsule destructor would."""
        for cap, name, m in self._capsules:
            if _api.PyCapsule_IsValid(cap, name):
                m.deleter(ctypes.addressof(m))
        self._capsules.clear()
        return self.deleted

    def __dlpack__(self, **kwargs):
        self.requests.append(kwargs)
        if self.legacy and kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        return self.capsule(versioned=not self.legacy and kwargs.get("max_version") is not None)

    def __dlpack_device__(self):
        return self.dlpack_device


def host_buffer(values, dtype=np.float32):
    """A fresh NumPy array to point a hand-made capsule at."""
    return np.array(values, dtype=dtype)
