"""Where the compiled extension comes from.

Two ways, the same C++ source (``csrc/ops.cpp``):

* ahead of time: ``pip install ./python`` runs ``setup.py``, which builds the C library with the
  repository's CMake and the extension with ``torch.utils.cpp_extension``, and installs both in
  the package (``spconv_c/_C.so`` beside ``spconv_c/lib/libspconv.so``);
* just in time, from a checkout: :func:`load_jit` builds the C library (CMake, ``build/`` of the
  checkout, as ``tools/test.sh`` does) when it is missing and compiles the extension with
  ``torch.utils.cpp_extension.load`` into ``build/python-ext/``. It runs on first import when no
  compiled extension is installed; ``SPCONV_C_JIT=1`` forces it.
"""

import os
import subprocess
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CSRC = PACKAGE_DIR / "csrc" / "ops.cpp"


def repository_root():
    """The checkout this package sits in (python/spconv_c/ -> the root), or None."""
    root = PACKAGE_DIR.parent.parent
    return root if (root / "include" / "spconv" / "spconv.h").is_file() else None


def build_c_library(root, build_dir, jobs=None):
    """Configure and build the shared C library (target ``spconv``) with the repository's CMake."""
    build_dir = Path(build_dir)
    jobs = str(jobs or os.environ.get("SPCONV_C_JOBS", "2"))
    if not (build_dir / "CMakeCache.txt").is_file():
        subprocess.run(["cmake", "-S", str(root), "-B", str(build_dir), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", "-DSPCONV_BUILD_TESTS=OFF",
                        "-DSPCONV_BUILD_TOOLS=OFF"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), "-j", jobs, "--target", "spconv"],
                   check=True, stdout=subprocess.DEVNULL)
    return build_dir


def load_jit(build_dir=None, verbose=False):
    """Compile (if out of date) and load the extension from a checkout; returns the library path.

    ``build_dir`` is the CMake build folder holding ``libspconv.so`` (default: ``build/`` of the
    checkout, ``$SPCONV_C_BUILD_DIR`` when set). The extension is linked against that library
    with an rpath to it, so the checkout's build is what runs.
    """
    import torch.utils.cpp_extension as cpp

    root = repository_root()
    if root is None:
        raise ImportError("spconv_c: no compiled extension is installed and this package is not in "
                          "a spconv-c checkout, so it cannot be built just in time "
                          "(install it with `pip install ./python`)")
    build_dir = Path(build_dir or os.environ.get("SPCONV_C_BUILD_DIR", root / "build"))
    build_c_library(root, build_dir)
    ext_dir = build_dir / "python-ext"
    ext_dir.mkdir(parents=True, exist_ok=True)
    lib_dir = str(build_dir.resolve())
    return cpp.load(
        name="spconv_c_ops",
        sources=[str(CSRC)],
        extra_include_paths=[str(root / "include"), str(build_dir / "generated")],
        extra_cflags=["-O2", "-Wall"],
        extra_ldflags=[f"-L{lib_dir}", "-lspconv", f"-Wl,-rpath,{lib_dir}"],
        build_directory=str(ext_dir),
        is_python_module=False,
        verbose=verbose,
    )


def load():
    """Load the operators: the installed extension, else the just-in-time build."""
    if os.environ.get("SPCONV_C_JIT") != "1":
        # The installed extension is a plain shared library of operators (no Python module):
        # loading it registers torch.ops.spconv_c.
        installed = sorted(PACKAGE_DIR.glob("_C*.so"))
        if installed:
            import torch
            torch.ops.load_library(str(installed[0]))
            return "aot"
    load_jit(verbose=os.environ.get("SPCONV_C_VERBOSE") == "1")
    return "jit"


if __name__ == "__main__":
    print(load_jit(verbose=True), file=sys.stderr)
