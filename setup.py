"""Build script: the one place that lists the compiled modules and the Cython directives."""
import os
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent

DIRECTIVES = {
    "language_level": 3,
    "binding": True,
    "embedsignature": False,   # binding=True: inspect.signature() and help() read the signature
    "cdivision": True,
}
if os.environ.get("ETPTR_CYTHON_DEBUG") == "1":
    DIRECTIVES.update(initializedcheck=True, nonecheck=True)
MACROS = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if os.environ.get("ETPTR_COVERAGE") == "1":
    DIRECTIVES["linetrace"] = True
    MACROS.append(("CYTHON_TRACE_NOGIL", "1"))

# The host copy threads are pthreads; the CUDA driver layer finds libcuda with dlopen.
THREADED = {"etptr._core._host_copy"}
DLOPEN = {"etptr.cuda._driver"}


def extensions():
    exts = []
    for pyx in sorted(HERE.glob("etptr/**/*.pyx")):
        rel = pyx.relative_to(HERE)
        name = ".".join(rel.with_suffix("").parts)
        flags = ["-O3"]
        link = []
        libs = []
        if name in THREADED:
            flags.append("-pthread")
            link.append("-pthread")
        if name in DLOPEN:
            libs.append("dl")
        exts.append(Extension(
            name, [str(rel)],
            include_dirs=[numpy.get_include(), str(HERE / "etptr" / "_core")],
            define_macros=MACROS,
            extra_compile_args=flags,
            extra_link_args=link,
            libraries=libs,
        ))
    return exts


setup(
    ext_modules=cythonize(
        extensions(),
        compiler_directives=DIRECTIVES,
        build_dir="build/cython",
        nthreads=os.cpu_count() or 1,
    ),
)
