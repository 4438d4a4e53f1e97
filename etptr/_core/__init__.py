"""Compiled core of etptr. Private: import public names from :mod:`etptr`."""
import os
from importlib.machinery import EXTENSION_SUFFIXES


def _missing_core_message(package_init: str) -> "str | None":
    """Why ``etptr._core`` cannot be imported, or None when that is not the reason.

    ``package_init`` is ``etptr/__init__.py``. Returns a message when the compiled
    modules are absent (an uncompiled source tree shadowing the installed package,
    or an installation built without compiling anything) or were compiled for
    another Python; None when a module for this Python is there but failed to
    load for some other reason (then the original ImportError says why).
    """
    package = os.path.dirname(os.path.abspath(package_init))
    core = os.path.join(package, "_core")
    try:
        names = os.listdir(core)
    except OSError:
        names = []
    if any(name == "_error" + suffix for name in names for suffix in EXTENSION_SUFFIXES):
        return None
    others = sorted(name for name in names if name.startswith("_error.")
                    and name.endswith((".so", ".pyd")))
    if others:
        return (
            f"etptr's compiled core in {core} was built for another Python ({', '.join(others)}; "
            f"this interpreter loads {', '.join('_error' + s for s in EXTENSION_SUFFIXES)}). "
            "Reinstall etptr with this Python: python -m pip install --force-reinstall etptr")
    if "_error.pyx" in names:
        return (
            f"etptr's compiled core is missing from {package}: this is an uncompiled source "
            "checkout shadowing the installed package (python -m, python -c and the interactive "
            "interpreter put the current folder first on sys.path). Run from another folder, use "
            "the pytest script instead of python -m pytest, or build in place with pip install -e .")
    return (
        f"etptr's compiled core is missing from {package}: this installation has no compiled "
        "modules (it was built without compiling etptr/_core, for example from an sdist that "
        "lacks the .pyx sources). Reinstall from a source tree or an sdist that carries them, "
        "with a C compiler: python -m pip install --force-reinstall --no-binary etptr etptr")
