"""Builds holdfast_torch, holdfast's PyTorch binding: the package holdfast_torch (Python) and its
compiled part holdfast_torch._C (holdfast_torch.cpp over the headers in ../../include), with
torch's BuildExtension against the torch installed in the building environment.

    pip install --no-build-isolation ./packaging/python     # from the repository's top
    pip wheel --no-build-isolation --no-deps -w dist ./packaging/python

The version is the library's (include/holdfast/version.hpp). The wheel records the torch it was
built for (holdfast_torch/_build_info.py); importing it under another torch fails at once,
naming both. Build files go to <repo>/build/python (HOLDFAST_PYTHON_BUILD overrides), not here.
"""
import glob
import os
import re
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INCLUDE = os.path.join(REPO, "include")

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    sys.exit("holdfast_torch builds against the torch of the environment it is installed into, "
             "and none is importable here: install torch first (pip install -r "
             "examples/pytorch/requirements.txt), then pip install --no-build-isolation "
             "./packaging/python")


def library_version():
    path = os.path.join(INCLUDE, "holdfast", "version.hpp")
    if not os.path.isfile(path):
        sys.exit(f"holdfast's headers are not at {INCLUDE}: holdfast_torch builds from a "
                 "checkout of the holdfast repository (packaging/python inside it), not from a "
                 "copy of this directory alone or an sdist")
    with open(path) as f:
        found = re.search(r'#define HOLDFAST_VERSION_STRING "([^"]+)"', f.read())
    if not found:
        sys.exit(f"{path}: no HOLDFAST_VERSION_STRING")
    return found.group(1)


VERSION = library_version()
TORCH = torch.__version__
# torch's own requirement without its local part (2.15.0+cpu -> 2.15.0): pip matches it to any
# build of that release, and the import checks the exact one.
TORCH_RELEASE = TORCH.split("+", 1)[0]


class build_py_with_info(build_py):
    """Also writes holdfast_torch/_build_info.py into the build (never into the source tree)."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "holdfast_torch", "_build_info.py")
        with open(target, "w") as f:
            f.write('"""Written by packaging/python/setup.py when this package was built."""\n'
                    f"VERSION = {VERSION!r}\nTORCH_VERSION = {TORCH!r}\n")


build_base = os.environ.get("HOLDFAST_PYTHON_BUILD") or os.path.join(REPO, "build", "python")
os.makedirs(build_base, exist_ok=True)

setup(
    name="holdfast-torch",
    version=VERSION,
    description="holdfast for PyTorch: preemption handling, agreed checkpoints, a file cache",
    packages=["holdfast_torch"],
    python_requires=">=3.9",
    install_requires=[f"torch=={TORCH_RELEASE}"],
    ext_modules=[
        CppExtension(
            "holdfast_torch._C",
            ["holdfast_torch.cpp"],
            include_dirs=[INCLUDE],
            # Without ninja, setuptools rebuilds only when a file named here is newer.
            depends=sorted(glob.glob(os.path.join(INCLUDE, "holdfast", "**", "*.hpp"),
                                     recursive=True)),
            # No -std: torch passes the standard its headers need (holdfast builds as C++17 and
            # C++20). -g0 over Python's -g (a 10x larger module, a slower build); hidden
            # visibility as pybind11 advises (the module exports only PyInit__C).
            extra_compile_args=["-O2", "-g0", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": BuildExtension, "build_py": build_py_with_info},
    options={"build": {"build_base": build_base},
             "egg_info": {"egg_base": build_base}},
    zip_safe=False,
)
