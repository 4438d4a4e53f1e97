"""Packaging: the licence, the version, what the sdist carries, how the build refuses a
tree without sources, the message when the compiled core is missing, and release builds
without debug information."""
import importlib.metadata
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

import etptr

ROOT = Path(__file__).resolve().parents[2]         # a checkout, or an unpacked sdist
PACKAGE = Path(etptr.__file__).resolve().parent       # the etptr under test
SOURCE_TREE = (ROOT / "setup.py").is_file() and (ROOT / "pyproject.toml").is_file()


def _run(args, cwd, **kwargs):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, **kwargs)


# ------------------------------------------------------------------ licence and version

def _check_licence(text):
    assert text.startswith("BSD 3-Clause License\n")
    assert "Copyright (c) 2026, etptr developers" in text
    assert "3. Neither the name of the copyright holder nor the names of its" in text


@pytest.mark.skipif(not SOURCE_TREE, reason="needs the source tree")
def test_licence_file_in_the_source_tree():
    _check_licence((ROOT / "LICENSE").read_text())
    assert 'license = "BSD-3-Clause"' in (ROOT / "pyproject.toml").read_text()


def test_installed_distribution_carries_the_licence():
    dist = importlib.metadata.distribution("etptr")
    assert dist.metadata["License-Expression"] == "BSD-3-Clause"
    assert "LICENSE" in dist.metadata.get_all("License-File", [])
    files = [f for f in (dist.files or []) if f.name == "LICENSE"]
    assert files, "the installed distribution has no LICENSE file"
    _check_licence(files[0].read_text())


def test_version_comes_from_the_package_metadata():
    assert etptr.__version__ == importlib.metadata.version("etptr")
    assert isinstance(etptr.__version__, str) and etptr.__version__[0].isdigit()


def _version_with(tmp_path, patched_version):
    script = textwrap.dedent(f"""
        import importlib.metadata as md
        {patched_version}
        md.version = version
        import sys
        sys.path.insert(0, {str(PACKAGE.parent)!r})
        import etptr
        print(etptr.__version__)
    """)
    proc = _run(["-c", script], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_version_follows_the_metadata(tmp_path):
    # Regression: __version__ was a literal in etptr/__init__.py.
    assert _version_with(tmp_path, "def version(name): return '9.9.9' if name == 'etptr' else '0'") \
        == "9.9.9"


def test_version_without_metadata_falls_back(tmp_path):
    # An in-place build has no installed metadata: the version comes from the
    # pyproject.toml beside the package, or is "0+unknown" without one.
    got = _version_with(tmp_path, "def version(name): raise md.PackageNotFoundError(name)")
    pyproject = PACKAGE.parent / "pyproject.toml"
    if pyproject.is_file():
        expected = re.search(r'(?m)^version = "(.+)"', pyproject.read_text()).group(1)
    else:
        expected = "0+unknown"
    assert got == expected


# ------------------------------------------------------------------ the missing-core message

def _fake_package(root, *core_files):
    """etptr's pure-Python files under ``root``, plus empty ``core_files`` in _core/."""
    (root / "etptr" / "_core").mkdir(parents=True)
    shutil.copy(PACKAGE / "__init__.py", root / "etptr" / "__init__.py")
    shutil.copy(PACKAGE / "_core" / "__init__.py", root / "etptr" / "_core" / "__init__.py")
    for name in core_files:
        (root / "etptr" / "_core" / name).write_bytes(b"")
    return root


@pytest.mark.parametrize("core_files, fragment", [
    ((), "this installation has no compiled modules"),
    (("_error.pyx", "_scalar_type.pyx"), "this is an uncompiled source checkout"),
    (("_error.cpython-39-x86_64-linux-gnu.so",), "was built for another Python"),
], ids=["installed-without-modules", "source-checkout", "other-python"])
def test_missing_compiled_core_says_why(tmp_path, core_files, fragment):
    # Regression: an installed package without compiled modules (a wheel built from an
    # sdist that lacked the .pyx files) failed with a bare "No module named ..._error".
    root = _fake_package(tmp_path, *core_files)
    proc = _run(["-c", "import etptr"], cwd=root)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: etptr's compiled core")
    assert fragment in last
    assert str(root / "etptr") in last


def test_a_core_that_fails_for_another_reason_keeps_its_own_error(tmp_path):
    from importlib.machinery import EXTENSION_SUFFIXES
    root = _fake_package(tmp_path, "_error" + EXTENSION_SUFFIXES[0])   # not a real library
    proc = _run(["-c", "import etptr"], cwd=root)
    assert proc.returncode == 1
    assert "compiled core" not in proc.stderr
    assert "ImportError" in proc.stderr


# ------------------------------------------------------------------ sdist and build

def _have(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.skipif(not SOURCE_TREE, reason="needs the source tree")
@pytest.mark.skipif(not _have("build", "setuptools"), reason="needs the build and setuptools packages")
def test_sdist_carries_everything_a_build_and_the_tests_need(tmp_path):
    # Regression: the sdist left out every .pyx, _dlpack.pxi and the test helpers, so a
    # wheel built from it had no compiled core.
    proc = _run(["-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sdist,) = tmp_path.glob("etptr-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    sources = {p.relative_to(ROOT).as_posix() for ext in ("pyx", "pxd", "pxi", "h", "pyi")
               for p in (ROOT / "etptr").rglob(f"*.{ext}")}
    assert {"etptr/_core/_error.pyx", "etptr/_core/_dlpack.pxi"} <= sources
    assert sources - names == set()
    needed = {"README.md", "LICENSE", "pyproject.toml", "setup.py", "MANIFEST.in",
              "etptr/py.typed", "examples/quickstart.py", "bench/tools/reshard.py",
              "tests/conftest.py", "tests/_helpers.py", "tests/fakes/fakecupy.py",
              "tests/_dlpack_ctypes.py", "tests/safety/_fuzz_main.py",
              "tests/stubtest_allowlist.txt",
              "tests/cuda/conftest.py", "tests/fakes/fakecuda.c", "bench/results/DECISIONS.md"}
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py")}
    probes = {p.relative_to(ROOT).as_posix() for ext in ("c", "h", "sh")
              for p in (ROOT / "bench" / "tools").glob(f"*.{ext}")}
    assert "bench/tools/probe_tiny.c" in probes and "bench/tools/probe_cuda.h" in probes
    assert (needed | tests | probes) - names == set()
    assert sorted(n for n in names if n.endswith((".so", ".c", ".pyc"))) == \
        sorted(["tests/fakes/fakecuda.c"] + [p for p in probes if p.endswith(".c")])


@pytest.mark.skipif(not SOURCE_TREE, reason="needs the source tree")
@pytest.mark.skipif(not _have("setuptools"), reason="needs setuptools")
def test_build_refuses_a_tree_without_pyx_sources(tmp_path):
    # Regression: such a tree built a pure-Python wheel that could not import.
    shutil.copy(ROOT / "setup.py", tmp_path / "setup.py")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "LICENSE", tmp_path / "LICENSE")
    _fake_package(tmp_path)
    proc = _run(["setup.py", "build_ext"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "etptr: no etptr/**/*.pyx under" in proc.stderr
    assert "there is no compiled core to build" in proc.stderr
    assert not list(tmp_path.rglob("*.so"))


# ------------------------------------------------------------------ release builds

def _elf_sections(path):
    """Section names of a 64-bit little-endian ELF file."""
    data = Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, path
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_offset, strtab_size = headers[shstrndx][4], headers[shstrndx][5]
    strtab = data[strtab_offset:strtab_offset + strtab_size]
    return {strtab[h[0]:strtab.index(b"\0", h[0])].decode() for h in headers}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ELF files")
@pytest.mark.skipif(os.environ.get("ETPTR_CYTHON_DEBUG") == "1",
                    reason="a debug build keeps its debug information")
def test_compiled_modules_carry_no_debug_information():
    # Regression: release builds carried DWARF and symbol tables (a 4.7 MB wheel).
    modules = sorted(PACKAGE.rglob("*.so"))
    assert len(modules) >= len(list(PACKAGE.rglob("*.pyx"))) and modules
    for so in modules:
        sections = _elf_sections(so)
        assert ".text" in sections and ".dynsym" in sections, so
        assert not {s for s in sections if s.startswith((".debug", ".zdebug"))}, so
        assert ".symtab" not in sections, so
