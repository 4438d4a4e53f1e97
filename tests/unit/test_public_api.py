"""The public surface: every exported name resolves, is documented, and matches API.md."""
import enum
import inspect

import pytest

import etptr
import etptr.testing

from _helpers import run_isolated

# Every name API.md promises from ``etptr``.
API_NAMES = {
    "ScalarType", "TensorShapeDynamism", "DeviceType", "Error", "element_size", "can_cast",
    "scalar_type_from_numpy", "scalar_type_to_numpy", "EtError", "EtWarning",
    "InvalidArgumentError", "InvalidTypeError", "NotSupportedError", "MemoryAllocationError",
    "NotFoundError", "InvalidStateError", "Device", "TensorPtr", "make_tensor_ptr",
    "clone_tensor_ptr", "resize_tensor_ptr", "clone_tensor_ptr_to", "clone_tensor_ptr_to_device",
    "clone_tensor_ptr_to_cpu", "for_blob", "from_blob", "empty", "empty_like", "empty_strided",
    "full", "full_like", "full_strided", "scalar_tensor", "zeros", "zeros_like", "ones",
    "ones_like", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
    "DeviceAllocator", "DeviceAllocatorRegistry", "register_device_allocator",
    "get_device_allocator", "DEFAULT_ALIGNMENT",
}


def test_all_is_sorted_unique_and_public():
    names = etptr.__all__
    assert len(names) == len(set(names))
    assert list(names) == sorted(names)
    assert all(not n.startswith("_") for n in names)


def test_api_md_names_are_exported():
    assert API_NAMES <= set(etptr.__all__)


@pytest.mark.parametrize("name", etptr.__all__)
def test_name_resolves_and_is_documented(name):
    obj = getattr(etptr, name)
    if name == "DEFAULT_ALIGNMENT":
        assert obj == 8
        return
    doc = inspect.getdoc(obj)
    assert doc and len(doc.strip()) > 20, f"{name} has no real docstring"
    if callable(obj) and not isinstance(obj, type):
        assert obj.__name__ == name


@pytest.mark.parametrize("name", etptr.testing.__all__)
def test_testing_names(name):
    obj = getattr(etptr.testing, name)
    assert inspect.getdoc(obj)


@pytest.mark.parametrize("name", ["ScalarType", "TensorShapeDynamism", "DeviceType", "Error"])
def test_enums_are_int_enums(name):
    cls = getattr(etptr, name)
    assert issubclass(cls, enum.IntEnum)


@pytest.mark.parametrize("name", [n for n in etptr.__all__
                                  if callable(getattr(etptr, n)) and not isinstance(getattr(etptr, n), type)])
def test_functions_have_signatures(name):
    sig = inspect.signature(getattr(etptr, name))
    assert all(p.kind is not inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values())


@pytest.mark.parametrize("cls, methods", [
    (etptr.TensorPtr, ["dim", "numel", "size", "element_size", "numpy", "__dlpack__",
                       "__dlpack_device__", "__array__"]),
    (etptr.DeviceAllocator, ["allocate", "deallocate", "copy_host_to_device", "copy_device_to_host",
                             "resolve_index", "allocate_host"]),
    (etptr.TensorPtrMaker, ["type", "dim_order", "strides", "dynamism", "deleter", "device",
                            "make_tensor_ptr"]),
    (etptr.Device, ["is_cpu"]),
])
def test_methods_are_documented(cls, methods):
    for m in methods:
        assert inspect.getdoc(getattr(cls, m)), f"{cls.__name__}.{m}"


def test_tensor_properties_are_documented():
    for prop in ("sizes", "dim_order", "strides", "scalar_type", "shape_dynamism", "device",
                 "data_ptr", "nbytes"):
        assert inspect.getdoc(getattr(etptr.TensorPtr, prop)), prop


def test_make_tensor_ptr_signature():
    params = inspect.signature(etptr.make_tensor_ptr).parameters
    assert list(params) == ["sizes", "data", "dim_order", "strides", "type", "dynamism",
                            "deleter", "device"]
    assert params["dynamism"].default == etptr.TensorShapeDynamism.DYNAMIC_BOUND


def test_version():
    assert isinstance(etptr.__version__, str) and etptr.__version__.count(".") == 2


def test_import_needs_no_cupy():
    proc = run_isolated("""
        import sys
        import etptr, etptr.testing
        print(sorted(m for m in sys.modules if m == "cupy" or m.startswith("cupy.")))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_import_is_light():
    # what a first load in a fresh process would pay for nothing: the CUDA layer, the
    # package metadata (read for __version__ on first use), NumPy's random generators
    # (made for rand* on first use), the hashing modules behind `secrets`
    proc = run_isolated("""
        import sys
        import etptr
        heavy = ("etptr.cuda", "importlib.metadata", "numpy.random", "secrets", "hmac")
        print(sorted(m for m in heavy if m in sys.modules))
        etptr.rand([2]); etptr.__version__
        print(sorted(m for m in heavy if m in sys.modules))
    """)
    assert proc.returncode == 0, proc.stderr
    first, later = proc.stdout.strip().splitlines()
    assert first == "[]"
    assert "numpy.random" in later and "importlib.metadata" in later


def test_signatures_show_names_not_codes_or_bare_sentinels():
    import inspect
    for fn in (etptr.make_tensor_ptr, etptr.empty, etptr.full, etptr.randint, etptr.for_blob,
               etptr.from_blob, etptr.DeviceMemoryBuffer.create,
               etptr.DeviceMemoryBuffer.tensor):
        text = str(inspect.signature(fn))
        assert "object at 0x" not in text, (fn, text)
        assert "type=6" not in text and "type=3" not in text, (fn, text)
    assert "type=<ScalarType.Float: 6>" in str(inspect.signature(etptr.empty))
    assert "data=<not given>" in str(inspect.signature(etptr.make_tensor_ptr))


def test_readme_many_tensors_example_runs(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = next(b for b in blocks if "clone_tensor_ptrs_to" in b)
    script = tmp_path / "example.py"
    script.write_text(example.replace("/tmp/x.safetensors", str(tmp_path / "x.safetensors")))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
