"""Ahead-of-time build of spconv_c: ``pip install --no-build-isolation ./python``.

The C library is built by the repository's own CMake (one build definition, the same
configuration checks as tools/test.sh: BLAS, OpenMP, PCL, CUDA), then the extension is compiled
by torch.utils.cpp_extension against it. Both land in the package: ``spconv_c/lib/libspconv.so``
and ``spconv_c/_C*.so`` (found through an rpath of $ORIGIN/lib). ``SPCONV_C_BUILD_DIR`` names an
existing CMake build folder to take the library from instead of building one.
"""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "spconv_c"))
import _build  # noqa: E402  (the same CMake driver as the just-in-time build)

build_dir = Path(os.environ.get("SPCONV_C_BUILD_DIR", HERE / "build" / "cmake"))
_build.build_c_library(ROOT, build_dir)
lib_dir = HERE / "spconv_c" / "lib"
lib_dir.mkdir(exist_ok=True)
for old in glob.glob(str(lib_dir / "libspconv.so*")):
    os.remove(old)
for so in glob.glob(str(build_dir / "libspconv.so*")):
    shutil.copy2(so, lib_dir, follow_symlinks=True)

setup(
    name="spconv_c",
    version="0.1.0",
    description="spconv-c sparse 3D convolution engine for PyTorch (spconv 2.x-compatible modules)",
    packages=["spconv_c", "spconv_c.pytorch"],
    package_data={"spconv_c": ["lib/libspconv.so*", "csrc/*.cpp"]},
    ext_modules=[
        CppExtension(
            "spconv_c._C",
            ["spconv_c/csrc/ops.cpp"],
            include_dirs=[str(ROOT / "include"), str(build_dir / "generated")],
            library_dirs=[str(lib_dir)],
            libraries=["spconv"],
            extra_compile_args=["-O2"],
            extra_link_args=["-Wl,-rpath,$ORIGIN/lib"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "numpy"],
)
