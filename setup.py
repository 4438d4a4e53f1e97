"""Build script: the one place that lists the compiled modules and the Cython directives.

Every ``etptr/**/*.pyx`` is one extension module. The modules are cythonized when
they are built (``build_ext``), not when this file is read, so that making an
sdist needs neither Cython nor NumPy. Release builds carry no debug information
(``-g0``, and stripped at link on Linux); ``ETPTR_CYTHON_DEBUG=1`` keeps it and
turns on Cython's run-time checks.
"""
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
DEBUG = os.environ.get("ETPTR_CYTHON_DEBUG") == "1"

DIRECTIVES = {
    "language_level": 3,
    "binding": True,
    "embedsignature": False,   # binding=True: inspect.signature() and help() read the signature
    "cdivision": True,
}
if DEBUG:
    DIRECTIVES.update(initializedcheck=True, nonecheck=True)
MACROS = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if os.environ.get("ETPTR_COVERAGE") == "1":
    DIRECTIVES["linetrace"] = True
    MACROS.append(("CYTHON_TRACE_NOGIL", "1"))

# The host copy threads are pthreads; the CUDA driver layer finds libcuda with dlopen.
THREADED = {"etptr._core._host_copy"}
DLOPEN = {"etptr.cuda._driver"}


def extensions():
    """One Extension per .pyx under etptr/; refuses to build a package without any."""
    exts = []
    headers = [str(h.relative_to(HERE)) for h in sorted(HERE.glob("etptr/**/*.h"))]
    for pyx in sorted(HERE.glob("etptr/**/*.pyx")):
        rel = pyx.relative_to(HERE)
        name = ".".join(rel.with_suffix("").parts)
        flags = ["-O3"]
        link = []
        libs = []
        if not DEBUG:
            flags.append("-g0")            # after the interpreter's own -g, so it wins
            if sys.platform.startswith("linux"):
                link.append("-s")          # strip the symbol table too
        if name in THREADED:
            flags.append("-pthread")
            link.append("-pthread")
        if name in DLOPEN:
            libs.append("dl")
        exts.append(Extension(
            name, [str(rel)],
            depends=headers,               # rebuilt when a C header they include changes
            include_dirs=[str(HERE / "etptr" / "_core"), str(HERE / "etptr" / "cuda")],
            define_macros=MACROS,
            extra_compile_args=flags,
            extra_link_args=link,
            libraries=libs,
        ))
    if not exts:
        raise SystemExit(
            f"etptr: no etptr/**/*.pyx under {HERE.resolve()}: there is no compiled core to "
            "build, and etptr does not work without it. Build from a checkout of the "
            "repository or from an sdist that carries the .pyx sources.")
    return exts


class cythonize_build_ext(build_ext):
    """build_ext that cythonizes the modules first (Cython and NumPy are build requirements).

    Cythonizing in ``run`` (not ``finalize_options``) keeps ``sdist``, which only
    asks build_ext for its source files, from needing Cython or NumPy.
    """

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:       # compile the C files on every core (pip passes no -j)
            self.parallel = os.cpu_count() or 1

    def run(self):
        import numpy
        from Cython.Build import cythonize

        for ext in self.extensions:
            ext.include_dirs.append(numpy.get_include())
        generated = cythonize(
            self.extensions,
            compiler_directives=DIRECTIVES,
            build_dir="build/cython",
            nthreads=os.cpu_count() or 1,
        )
        # keep the Extension objects finalize_options prepared; take the generated C sources
        sources = {ext.name: ext.sources for ext in generated}
        for ext in self.extensions:
            ext.sources = sources[ext.name]
        super().run()


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": cythonize_build_ext},
)
