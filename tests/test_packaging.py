"""Packaging: the licence."""
import importlib.metadata
from pathlib import Path

import pytest

import etptr

ROOT = Path(__file__).resolve().parent.parent        # a checkout, or an unpacked sdist
SOURCE_TREE = (ROOT / "setup.py").is_file() and (ROOT / "pyproject.toml").is_file()


# ------------------------------------------------------------------ licence

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
