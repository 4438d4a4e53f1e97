"""The hand-written .pyi stubs: mypy.stubtest against the compiled modules, and
``mypy --strict`` on examples/quickstart.py (skipped when mypy is not installed)."""
import importlib.machinery
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import etptr

pytest.importorskip("mypy")

HERE = Path(__file__).resolve().parent.parent           # tests/
QUICKSTART = HERE.parent / "examples" / "quickstart.py"
_PKG = Path(etptr.__file__).resolve().parent
# The compiled modules as installed (a wheel holds no .pyx): every extension module file.
COMPILED = sorted({".".join(p.relative_to(_PKG.parent).parts[:-1] + (p.name.split(".")[0],))
                   for suffix in importlib.machinery.EXTENSION_SUFFIXES
                   for p in _PKG.rglob("*" + suffix)})


def _env():
    """Find the etptr this process imports: a build in place, or an installed package."""
    root = str(Path(etptr.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    installed = {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("purelib", "platlib")}
    if root not in installed:
        env["MYPYPATH"] = root        # mypy refuses site-packages there; it finds those by py.typed
    return env


def _run(args, tmp_path):
    """``python -m <args>`` in tmp_path (so the checkout's uncompiled etptr/ is not in the way)."""
    proc = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_stubtest_compiled_modules(tmp_path):
    assert len(COMPILED) >= 19, COMPILED           # every .pyx of the package, compiled
    rc, out = _run(["mypy.stubtest", "--allowlist", str(HERE / "stubtest_allowlist.txt"),
                    *COMPILED], tmp_path)
    assert rc == 0, out


def test_quickstart_passes_mypy_strict(tmp_path):
    rc, out = _run(["mypy", "--strict", str(QUICKSTART)], tmp_path)
    assert rc == 0, out
    assert "Success" in out


def test_public_python_modules_pass_mypy_strict(tmp_path):
    # the pure-Python public surface besides the stubs: etptr, etptr.cuda, etptr.testing
    rc, out = _run(["mypy", "--strict", "-m", "etptr", "-m", "etptr.cuda", "-m", "etptr.testing"],
                   tmp_path)
    assert rc == 0, out
    assert "Success" in out


def test_stubs_catch_wrong_types(tmp_path):
    # the stubs are precise enough to refuse misuse (they are not Any)
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("""\
        import etptr, ml_dtypes, numpy as np
        t = etptr.zeros([2, 3])
        n: str = t.numel()
        etptr.resize_tensor_ptr(t, "2x3")
        etptr.clone_tensor_ptr(t, type="half")
        etptr.full([2], "seven")
        d: etptr.Device = t.device
        s: int = t.__cuda_array_interface__["typestr"]
        etptr.from_dlpack(42)
        etptr.zeros([2], type=1.5)
        etptr.clone_tensor_ptr(t, type="BFloat16")
        etptr.zeros([2], type=np.float16)
        etptr.can_cast(np.dtype("int32"), ml_dtypes.bfloat16)
        etptr.element_size(etptr.ScalarType.Half)
        """))
    rc, out = _run(["mypy", "--strict", str(bad)], tmp_path)
    assert rc == 1, out
    for line in (3, 4, 5, 6, 8, 9, 10):
        assert f"bad.py:{line}: error" in out, out
    for line in (1, 2, 7, 11, 12, 13, 14):  # right, and every scalar type spelling is accepted
        assert f"bad.py:{line}: error" not in out, out


def test_quickstart_runs(tmp_path):
    proc = subprocess.run([sys.executable, str(QUICKSTART)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "devices:" in proc.stdout


def _readme_example():
    """The README's "A short example" code block."""
    import re
    text = (HERE.parent / "README.md").read_text()
    match = re.search(r"## A short example\n\n```python\n(.*?)```", text, re.S)
    assert match, "README.md has no short example"
    return match.group(1)


def test_readme_example_is_strictly_typed_and_runs(tmp_path):
    example = tmp_path / "readme_example.py"
    example.write_text(_readme_example())
    rc, out = _run(["mypy", "--strict", str(example)], tmp_path)
    assert rc == 0, out
    proc = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("(2, 6) Half (2, 10) (10, 1)"), proc.stdout
