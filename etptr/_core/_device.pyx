"""Devices: ExecuTorch's ``DeviceType`` and ``Device`` (``runtime/core/device.h``)."""
import builtins

import numpy as np

from etptr._core._codes cimport DEVICE_CPU
from etptr._core._error cimport raise_error
from etptr._core._error import Error, NamedIntEnum


class DeviceType(NamedIntEnum):
    """ExecuTorch ``DeviceType``; ``str()`` gives ExecuTorch's enumerator name (``"CPU"``, ``"CUDA"``)."""
    CPU = 0
    CUDA = 1


_DEVICE_TYPES = tuple(DeviceType)
_NAMES = {"cpu": 0, "cuda": 1}


cdef Device c_make_device(int type, int index):
    cdef Device d = Device.__new__(Device)
    d.c_type = type
    d.c_index = index
    d.c_frozen = True
    return d


cdef int _check_index(object index, str argname) except -2:
    if isinstance(index, bool) or not (isinstance(index, int) or isinstance(index, np.integer)):
        raise_error(Error.InvalidType,
                    f"{argname}: device index must be an int, got {index!r}")
    if not -1 <= index <= 127:
        raise_error(Error.InvalidArgument,
                    f"{argname}: device index {index} is outside ExecuTorch's DeviceIndex "
                    f"(int8; -1 means the current device, valid range -1..127)")
    return index


cdef int _check_type(object type, str argname) except -1:
    if isinstance(type, bool) or not (isinstance(type, int) or isinstance(type, np.integer)):
        raise_error(Error.InvalidType,
                    f"{argname}: device type must be an etptr.DeviceType, got {type!r}")
    if not 0 <= type < len(_DEVICE_TYPES):
        raise_error(Error.InvalidArgument, f"{argname}: {type!r} is not a DeviceType code (0=CPU, 1=CUDA)")
    return type


cdef class Device:
    """Device(type, index=0)

    Where a tensor's memory lives: a :class:`DeviceType` and an index.

    Mirrors ExecuTorch ``Device``. Immutable and hashable; equal when type and
    index are equal. ``index`` is ExecuTorch's ``DeviceIndex`` (int8): -1 means
    the current device of that type.

    Parameters
    ----------
    type : DeviceType, str or torch.device
        ``DeviceType.CPU``, ``DeviceType.CUDA``, a string such as ``"cuda:1"``, or a
        ``torch.device`` (read as its string).
    index : int, optional
        Device index, -1..127. Ignored when ``type`` is a string that names one.

    Raises
    ------
    InvalidArgumentError
        Unknown device string, or an index outside int8.
    InvalidTypeError
        ``type`` or ``index`` of the wrong Python type.
    """

    def __init__(self, type, index=0):
        cdef Device parsed
        if self.c_frozen:
            raise_error(Error.InvalidState,
                        f"Device {self} is immutable; build a new one with etptr.Device(...)")
        if builtins.type(type).__name__ == "device" and builtins.type(type).__module__ == "torch":
            type = str(type)                # a torch.device: read as its string
        if isinstance(type, str):
            parsed = c_device(type, "type")
            self.c_type = parsed.c_type
            self.c_index = parsed.c_index if ":" in type else _check_index(index, "index")
        else:
            self.c_type = _check_type(type, "type")
            self.c_index = _check_index(index, "index")
        self.c_frozen = True

    @property
    def type(self):
        """The :class:`DeviceType`."""
        return _DEVICE_TYPES[self.c_type]

    @property
    def index(self):
        """The device index (int; -1 means the current device)."""
        return self.c_index

    def is_cpu(self):
        """True for a CPU device."""
        return self.c_type == DEVICE_CPU

    def __eq__(self, other):
        if not isinstance(other, Device):
            return NotImplemented
        return self.c_type == (<Device>other).c_type and self.c_index == (<Device>other).c_index

    def __ne__(self, other):
        if not isinstance(other, Device):
            return NotImplemented
        return not (self.c_type == (<Device>other).c_type and self.c_index == (<Device>other).c_index)

    def __hash__(self):
        return hash((self.c_type, self.c_index))

    def __str__(self):
        if self.c_type == DEVICE_CPU:
            return "cpu"
        return f"cuda:{self.c_index}"

    def __repr__(self):
        return f"Device(DeviceType.{_DEVICE_TYPES[self.c_type].name}, {self.c_index})"

    def __reduce__(self):
        return (Device, (_DEVICE_TYPES[self.c_type], self.c_index))


cdef Device c_device(object spec, str argname):
    """Parse ``spec`` (Device, DeviceType, "cpu", "cuda", "cuda:N", a torch.device) into a
    Device."""
    cdef str s, head, tail
    if isinstance(spec, Device):
        return <Device>spec
    if isinstance(spec, str):
        s = (<str>spec).strip().lower()
        head, sep, tail = s.partition(":")
        if head not in _NAMES or (sep and not tail):
            raise_error(Error.InvalidArgument,
                        f"{argname}={spec!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'")
        if not sep:
            return c_make_device(_NAMES[head], 0)
        digits = tail[1:] if tail[:1] in ("-", "+") else tail
        if not (digits.isascii() and digits.isdigit()):    # int() would take "1_0", " 1", "١"
            raise_error(Error.InvalidArgument,
                        f"{argname}={spec!r}: device index {tail!r} is not a decimal integer")
        idx = int(tail)
        if _NAMES[head] == 0 and idx != 0:
            raise_error(Error.InvalidArgument,
                        f"{argname}={spec!r}: the CPU has one device, index 0")
        return c_make_device(_NAMES[head], _check_index(idx, argname))
    if isinstance(spec, DeviceType):
        return c_make_device(_check_type(spec, argname), 0)
    if (isinstance(spec, int) or isinstance(spec, np.integer)) and not isinstance(spec, bool):
        # torch reads device=1 as cuda:1, ExecuTorch's DeviceType code 1 is CUDA (cuda:0)
        code = int(spec)
        meant = (f", ExecuTorch's DeviceType code {code} is {_DEVICE_TYPES[code].name}"
                 if 0 <= code < len(_DEVICE_TYPES) else "")
        raise_error(Error.InvalidArgument,
                    f"{argname}={spec!r}: a bare int is ambiguous (torch reads it as "
                    f"'cuda:{code}'{meant}): pass 'cuda:{code}', etptr.Device('cuda:{code}') "
                    f"or an etptr.DeviceType")
    if type(spec).__name__ == "device" and type(spec).__module__ == "torch":
        return c_device(str(spec), argname)     # torch.device('cuda:1') as 'cuda:1'
    raise_error(Error.InvalidType,
                f"{argname} must be an etptr.Device, a DeviceType, a torch.device or a "
                f"string like 'cuda:0', "
                f"got {spec!r} of type {type(spec).__name__}")


def as_device(spec, argname="device"):
    """Parse a device spelling: a :class:`Device`, a :class:`DeviceType`,
    ``"cpu"``, ``"cuda"``, ``"cuda:N"``, or a ``torch.device`` (read as its string).
    ``"cuda"`` means ``cuda:0``.
    """
    return c_device(spec, argname)
