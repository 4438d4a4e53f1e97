"""etptr._core._device: Device values and every accepted device spelling."""
import pickle

import numpy as np
import pytest

import etptr
from etptr import Device, DeviceType
from etptr._core._device import as_device

CPU0 = Device(DeviceType.CPU, 0)


@pytest.mark.parametrize("spec, expected", [
    ("cpu", (DeviceType.CPU, 0)),
    ("CPU", (DeviceType.CPU, 0)),
    ("  cuda  ", (DeviceType.CUDA, 0)),
    ("cuda", (DeviceType.CUDA, 0)),
    ("cuda:0", (DeviceType.CUDA, 0)),
    ("cuda:7", (DeviceType.CUDA, 7)),
    ("CUDA:127", (DeviceType.CUDA, 127)),
    ("cuda:-1", (DeviceType.CUDA, -1)),
    ("cuda:+3", (DeviceType.CUDA, 3)),
    (DeviceType.CPU, (DeviceType.CPU, 0)),
    (DeviceType.CUDA, (DeviceType.CUDA, 0)),
    (Device(DeviceType.CUDA, 5), (DeviceType.CUDA, 5)),
])
def test_accepted_spellings(spec, expected):
    d = as_device(spec)
    assert (d.type, d.index) == expected
    assert type(d.type) is DeviceType
    # the same spelling labels a raw tensor
    t = etptr.make_tensor_ptr([2], None, device=spec)
    assert (t.device.type, t.device.index) == expected


@pytest.mark.parametrize("spec, code", [(1, "CUDA"), (0, "CPU"), (np.int64(0), "CPU"), (5, None)])
def test_a_bare_int_is_refused_naming_both_readings(spec, code):
    # torch reads device=1 as cuda:1; ExecuTorch's DeviceType code 1 is CUDA (cuda:0)
    with pytest.raises(etptr.InvalidArgumentError) as info:
        as_device(spec)
    message = str(info.value)
    assert f"'cuda:{int(spec)}'" in message and "etptr.DeviceType" in message
    if code is not None:
        assert f"DeviceType code {int(spec)} is {code}" in message



@pytest.mark.parametrize("spec, cls, fragment", [
    ("gpu", etptr.InvalidArgumentError, "device='gpu' is not a device"),
    ("cuda:", etptr.InvalidArgumentError, "device='cuda:' is not a device"),
    ("cuda:x", etptr.InvalidArgumentError, "device='cuda:x': device index 'x'"),
    ("cuda:1:2", etptr.InvalidArgumentError, "device='cuda:1:2'"),
    ("cuda:128", etptr.InvalidArgumentError, "device index 128"),
    ("cuda:-2", etptr.InvalidArgumentError, "device index -2"),
    ("", etptr.InvalidArgumentError, "device='' is not a device"),
    (2, etptr.InvalidArgumentError, "device=2: a bare int is ambiguous"),
    (-1, etptr.InvalidArgumentError, "device=-1: a bare int is ambiguous"),
    (None, etptr.InvalidTypeError, "got None"),
    (1.0, etptr.InvalidTypeError, "got 1.0"),
    (True, etptr.InvalidTypeError, "got True"),
    (("cuda", 1), etptr.InvalidTypeError, "got ('cuda', 1)"),
    (b"cuda", etptr.InvalidTypeError, "got b'cuda'"),
])
def test_refused_spellings_name_the_argument(spec, cls, fragment):
    with pytest.raises(cls) as info:
        etptr.make_tensor_ptr([2], None, device=spec)
    msg = str(info.value)
    assert msg.startswith("device")
    assert fragment in msg


def test_a_torch_device_reads_as_its_string():
    torch = pytest.importorskip("torch")
    assert as_device(torch.device("cpu")) == CPU0
    assert as_device(torch.device("cuda", 3)) == Device("cuda:3")
    assert as_device(torch.device("cuda")) == Device("cuda:0")
    assert Device(torch.device("cuda:2")) == Device("cuda:2") and Device(torch.device("cpu")) == CPU0
    with pytest.raises(etptr.InvalidArgumentError, match="device='meta' is not a device"):
        etptr.make_tensor_ptr([2], None, device=torch.device("meta"))


def test_value_semantics():
    a = Device(DeviceType.CUDA, 3)
    assert a == Device("cuda:3") == Device("cuda", 3)
    assert hash(a) == hash(Device("cuda:3"))
    assert a != Device("cuda:2") and a != Device(DeviceType.CPU, 3)
    assert (a == "cuda:3") is False  # no implicit parsing in ==
    assert (a != "cuda:3") is True
    assert {a: 1}[Device("cuda:3")] == 1
    assert a.is_cpu() is False and CPU0.is_cpu() is True
    assert str(a) == "cuda:3" and str(CPU0) == "cpu"
    assert repr(a) == "Device(DeviceType.CUDA, 3)" and repr(CPU0) == "Device(DeviceType.CPU, 0)"
    assert eval(repr(a), {"Device": Device, "DeviceType": DeviceType}) == a
    assert Device(DeviceType.CPU) == CPU0


def test_device_type_str_is_the_executorch_name():
    # Regression: str() gave the code ("0") on Python 3.11+ and "DeviceType.CPU" before.
    assert (str(DeviceType.CPU), str(DeviceType.CUDA)) == ("CPU", "CUDA")
    assert f"{DeviceType.CUDA}" == format(DeviceType.CUDA) == "CUDA"
    assert f"{DeviceType.CUDA:d}" == "1" and f"{DeviceType.CUDA:>6}" == "  CUDA"
    assert DeviceType.CUDA == 1 and int(DeviceType.CUDA) == 1 and hash(DeviceType.CUDA) == hash(1)
    assert repr(DeviceType.CUDA) == "<DeviceType.CUDA: 1>"
    assert pickle.loads(pickle.dumps(DeviceType.CUDA)) is DeviceType.CUDA


def test_string_index_wins_over_index_argument():
    assert Device("cuda:2", 5).index == 2
    assert Device("cuda", 5).index == 5


def test_pickle_round_trip():
    for d in (CPU0, Device("cuda:-1"), Device("cuda:127")):
        again = pickle.loads(pickle.dumps(d))
        assert again == d and type(again) is Device


def test_attributes_are_read_only():
    d = Device("cuda:1")
    with pytest.raises(AttributeError):
        d.index = 2
    with pytest.raises(AttributeError):
        d.c_index = 2
    assert d.index == 1


def test_devices_cannot_be_reinitialised():
    # Regression: calling __init__ again mutated the Device in place, including the
    # shared CPU device every CPU tensor points at (new tensors then claimed cuda:5).
    shared = etptr.make_tensor_ptr([1.0]).device
    for d in (shared, Device("cuda:1"), Device(DeviceType.CPU), as_device("cuda")):
        before = (d.type, d.index, hash(d))
        with pytest.raises(etptr.InvalidStateError) as info:
            d.__init__("cuda:5")
        assert "is immutable" in str(info.value)
        assert (d.type, d.index, hash(d)) == before
    assert etptr.make_tensor_ptr([2.0]).device == Device("cpu")
    assert etptr.make_tensor_ptr([2.0]).numpy().tolist() == [2.0]


@pytest.mark.parametrize("args, cls, argname", [
    ((DeviceType.CUDA, 128), etptr.InvalidArgumentError, "index"),
    ((DeviceType.CUDA, -2), etptr.InvalidArgumentError, "index"),
    ((DeviceType.CUDA, 1 << 80), etptr.InvalidArgumentError, "index"),
    ((DeviceType.CUDA, 1.0), etptr.InvalidTypeError, "index"),
    ((DeviceType.CUDA, "1"), etptr.InvalidTypeError, "index"),
    ((DeviceType.CUDA, False), etptr.InvalidTypeError, "index"),
    ((5,), etptr.InvalidArgumentError, "type"),
    ((None,), etptr.InvalidTypeError, "type"),
    (("tpu",), etptr.InvalidArgumentError, "type"),
])
def test_constructor_errors_name_the_argument(args, cls, argname):
    with pytest.raises(cls) as info:
        Device(*args)
    assert str(info.value).startswith(argname)


def test_numpy_integer_index():
    assert Device(DeviceType.CUDA, np.int8(4)).index == 4
    assert type(Device(DeviceType.CUDA, np.int8(4)).index) is int


def test_device_index_of_clone_destination(host_alloc):
    t = etptr.make_tensor_ptr([1.0, 2.0])
    d = etptr.clone_tensor_ptr_to_device(t, Device("cuda:4"))
    assert d.device == Device("cuda:4")
    assert host_alloc.last_allocate_index == 4
    d2 = etptr.clone_tensor_ptr_to_device(t, "cuda:4", device_index=6)
    assert d2.device == Device("cuda:6")
    assert host_alloc.last_allocate_index == 6
