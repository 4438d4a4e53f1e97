"""etptr._core._error: Error codes, the exception tree, pickling, and .error on raised exceptions."""
import copy
import pickle

import pytest

import etptr
from etptr import Error
from etptr._core._error import error_class

# runtime/core/error.h
ET_CODES = {
    "Ok": 0, "Internal": 1, "InvalidState": 2, "EndOfMethod": 3, "AlreadyLoaded": 4,
    "NotSupported": 16, "NotImplemented": 17, "InvalidArgument": 18, "InvalidType": 19,
    "OperatorMissing": 20, "RegistrationExceedingMaxKernels": 21,
    "RegistrationAlreadyRegistered": 22, "NotFound": 32, "MemoryAllocationFailed": 33,
    "AccessFailed": 34, "InvalidProgram": 35, "InvalidExternalData": 36, "OutOfResources": 37,
    "DelegateInvalidCompatibility": 48, "DelegateMemoryAllocationFailed": 49,
    "DelegateInvalidHandle": 50,
}

# class -> (builtin it also subclasses, default .error)
CLASSES = {
    etptr.InvalidArgumentError: (ValueError, Error.InvalidArgument),
    etptr.InvalidTypeError: (TypeError, Error.InvalidType),
    etptr.NotSupportedError: (NotImplementedError, Error.NotSupported),
    etptr.MemoryAllocationError: (MemoryError, Error.MemoryAllocationFailed),
    etptr.NotFoundError: (LookupError, Error.NotFound),
    etptr.InvalidStateError: (RuntimeError, Error.InvalidState),
}


def test_error_members_are_executorch_codes():
    assert {m.name: int(m) for m in Error} == ET_CODES
    assert issubclass(Error, int)
    assert Error(18) is Error.InvalidArgument


@pytest.mark.parametrize("name", list(ET_CODES))
def test_error_str_and_format_give_the_name(name):
    # Regression: str() gave the code ("18") on Python 3.11+ and "Error.InvalidArgument" before.
    e = Error[name]
    assert str(e) == f"{e}" == format(e) == name
    assert f"{e:d}" == str(ET_CODES[name]) and f"{e:#x}" == hex(ET_CODES[name])
    assert f"{e:<40}" == name.ljust(40)
    assert e == ET_CODES[name] and pickle.loads(pickle.dumps(e)) is e


def test_named_int_enum_base():
    # The shared base of etptr's ExecuTorch enums, for other modules' enums too.
    from etptr._core._error import NamedIntEnum

    class Colour(NamedIntEnum):
        RED = 0
        GREEN = 1

    assert issubclass(Colour, int) and issubclass(Error, NamedIntEnum)
    assert (str(Colour.GREEN), f"{Colour.GREEN}", f"{Colour.GREEN:03d}") == ("GREEN", "GREEN", "001")
    assert repr(Colour.RED) == "<Colour.RED: 0>" and Colour(1) is Colour.GREEN
    assert Colour.GREEN + 1 == 2 and sorted([Colour.GREEN, Colour.RED]) == [0, 1]


@pytest.mark.parametrize("cls", list(CLASSES), ids=lambda c: c.__name__)
def test_hierarchy_and_default_code(cls):
    builtin, code = CLASSES[cls]
    assert issubclass(cls, etptr.EtError)
    assert issubclass(cls, RuntimeError)
    assert issubclass(cls, builtin)
    e = cls("boom")
    assert e.error is code
    assert str(e) == "boom"
    assert isinstance(e, builtin)


def test_base_class_defaults_to_internal():
    e = etptr.EtError("x")
    assert e.error is Error.Internal
    assert isinstance(e, RuntimeError)
    assert etptr.EtError("x", Error.AccessFailed).error is Error.AccessFailed
    # an int code becomes the enum member
    assert etptr.EtError("x", 34).error is Error.AccessFailed


def test_warning_class():
    assert issubclass(etptr.EtWarning, RuntimeWarning)
    assert not issubclass(etptr.EtWarning, etptr.EtError)


@pytest.mark.parametrize("code, cls", [
    (Error.InvalidArgument, etptr.InvalidArgumentError),
    (Error.InvalidType, etptr.InvalidTypeError),
    (Error.NotSupported, etptr.NotSupportedError),
    (Error.NotImplemented, etptr.NotSupportedError),
    (Error.MemoryAllocationFailed, etptr.MemoryAllocationError),
    (Error.NotFound, etptr.NotFoundError),
    (Error.InvalidState, etptr.InvalidStateError),
    (Error.Internal, etptr.EtError),
    (Error.AccessFailed, etptr.EtError),
    (Error.DelegateInvalidHandle, etptr.EtError),
    (18, etptr.InvalidArgumentError),
])
def test_code_to_class_table(code, cls):
    assert error_class(code) is cls


@pytest.mark.parametrize("exc", [
    etptr.EtError("plain"),
    etptr.EtError("with code", Error.OutOfResources),
    etptr.InvalidArgumentError("sizes[0]=-1 is negative"),
    etptr.InvalidTypeError("type must be a ScalarType"),
    etptr.NotSupportedError("nope"),
    etptr.NotSupportedError("not implemented", Error.NotImplemented),
    etptr.MemoryAllocationError("out of memory"),
    etptr.NotFoundError("no allocator"),
    etptr.InvalidStateError("already registered"),
], ids=lambda e: f"{type(e).__name__}-{e.error.name}")
def test_exceptions_pickle_and_copy(exc):
    for clone in (pickle.loads(pickle.dumps(exc)), copy.copy(exc), copy.deepcopy(exc)):
        assert type(clone) is type(exc)
        assert str(clone) == str(exc)
        assert clone.error is exc.error


def test_raised_exception_pickles_with_its_code():
    with pytest.raises(etptr.EtError) as info:
        etptr.make_tensor_ptr([-1], None)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is etptr.InvalidArgumentError
    assert again.error is Error.InvalidArgument
    assert str(again) == str(info.value)


@pytest.mark.parametrize("call, cls, code", [
    (lambda: etptr.make_tensor_ptr([-1], None), etptr.InvalidArgumentError, Error.InvalidArgument),
    (lambda: etptr.make_tensor_ptr([2], [1.5, 2.5], type=etptr.ScalarType.Int),
     etptr.InvalidTypeError, Error.InvalidType),
    (lambda: etptr.make_tensor_ptr([2], None, type=1.5), etptr.InvalidTypeError, Error.InvalidType),
    (lambda: etptr.make_tensor_ptr([2], None, type="float"), etptr.InvalidArgumentError,
     Error.InvalidArgument),
    (lambda: etptr.scalar_type_to_numpy(etptr.ScalarType.QInt8),
     etptr.NotSupportedError, Error.NotSupported),
    (lambda: etptr.clone_tensor_ptr_to(etptr.make_tensor_ptr([1.0]), "cpu"),
     etptr.NotSupportedError, Error.NotSupported),
    (lambda: etptr.empty([1 << 61], type=etptr.ScalarType.Byte),
     etptr.MemoryAllocationError, Error.MemoryAllocationFailed),
], ids=["InvalidArgument", "refused-cast", "bad-type-arg", "bad-type-name", "NotSupported", "cpu-to-cpu", "MemoryAllocation"])
def test_errors_raised_by_the_api_carry_their_code(call, cls, code):
    with pytest.raises(cls) as info:
        call()
    assert type(info.value) is cls
    assert info.value.error is code


def test_not_found_error_from_missing_allocator():
    from etptr._core._device_allocator import _replace_allocator
    prev = _replace_allocator(etptr.DeviceType.CUDA, None)
    try:
        with pytest.raises(etptr.NotFoundError) as info:
            etptr.empty([2], device="cuda")
    finally:
        _replace_allocator(etptr.DeviceType.CUDA, prev)
    assert info.value.error is Error.NotFound
    assert isinstance(info.value, LookupError)
    assert "device=cuda:0" in str(info.value)


def test_invalid_state_from_double_registration():
    from etptr._core._device_allocator import _replace_allocator
    from etptr.testing import HostDeviceAllocator
    prev = _replace_allocator(etptr.DeviceType.CUDA, HostDeviceAllocator())
    try:
        with pytest.raises(etptr.InvalidStateError) as info:
            etptr.register_device_allocator(HostDeviceAllocator())
    finally:
        _replace_allocator(etptr.DeviceType.CUDA, prev)
    assert info.value.error is Error.InvalidState


def test_catching_the_builtin_catches_etptr_errors():
    with pytest.raises(ValueError):
        etptr.make_tensor_ptr([-3], None)
    with pytest.raises(TypeError):
        etptr.make_tensor_ptr([2.5], None)
    with pytest.raises(NotImplementedError):
        etptr.resize_tensor_ptr(etptr.make_tensor_ptr([2], [1, 2]), [3, 1])
