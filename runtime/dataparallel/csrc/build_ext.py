"""Build definition of the compiled collective core, called by setup.py.

Two extension objects, built in this order:

* ``shoal.dataparallel.libshoal_core``: the framework-neutral core, a plain
  shared library (file ``libshoal_core<EXT_SUFFIX>``, SONAME the same) with the
  C++ API of ``csrc/shoal/core.h``. Framework glue (the PyTorch backend) links
  this same file, so that one process has one core state.
* ``shoal.dataparallel._core``: the pybind11 binding, linked to the core with
  rpath ``$ORIGIN``.

The core compiles for the generic x86-64-v2 baseline; the reduction kernels
carry an AVX2 copy chosen at run time (kernels.cpp).
"""

import os
import platform
import sysconfig
from pathlib import Path

from setuptools import Extension

HERE = Path(__file__).resolve().parent
CORE_SOURCES = [
    "kernels.cpp", "net.cpp", "shm.cpp", "bootstrap.cpp", "comm.cpp", "allreduce.cpp",
    "interhost.cpp", "broadcast.cpp", "allgather.cpp", "p2p.cpp", "exchange.cpp", "engine.cpp",
]


def library_file_name():
    """The core's file name (and SONAME) inside the package directory."""
    return "libshoal_core" + sysconfig.get_config_var("EXT_SUFFIX")


def _rel(name):
    # setuptools wants source paths relative to the project root.
    root = Path.cwd()
    try:
        return str((HERE / name).relative_to(root))
    except ValueError:
        return str(HERE / name)


def _compile_args():
    args = ["-std=c++17", "-O3", "-pthread", "-fvisibility-inlines-hidden", "-Wall"]
    if platform.machine() in ("x86_64", "AMD64"):
        args.append("-march=x86-64-v2")
    return args


def _link_next_to_core():
    """Let the binding's link step find the core wherever build_ext put it.

    The output directory is only known inside build_ext (in place for editable
    installs, a temporary build tree for wheels), so the binding gets it there.
    """
    from setuptools.command import build_ext as command

    cls = command.build_ext
    if getattr(cls, "_shoal_core_dirs", False):
        return
    original = cls.build_extension

    def build_extension(self, ext):
        if ext.name == "shoal.dataparallel._core":
            core_path = self.get_ext_fullpath("shoal.dataparallel.libshoal_core")
            ext.library_dirs = [os.path.dirname(core_path), *ext.library_dirs]
        return original(self, ext)

    cls.build_extension = build_extension
    cls._shoal_core_dirs = True


def extensions():
    """The setuptools Extension objects of the core and its binding."""
    import pybind11

    _link_next_to_core()
    lib = library_file_name()
    core = Extension(
        "shoal.dataparallel.libshoal_core",
        sources=[_rel(s) for s in CORE_SOURCES],
        include_dirs=[_rel(".")],
        extra_compile_args=_compile_args(),
        extra_link_args=["-pthread", "-lrt", f"-Wl,-soname,{lib}"],
        language="c++",
    )
    binding = Extension(
        "shoal.dataparallel._core",
        sources=[_rel("binding.cpp")],
        include_dirs=[_rel("."), pybind11.get_include()],
        extra_compile_args=_compile_args() + ["-fvisibility=hidden"],
        extra_link_args=["-pthread", f"-l:{lib}", "-Wl,-rpath,$ORIGIN"],
        language="c++",
    )
    return [core, binding]
