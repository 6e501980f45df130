"""Build script: the package map from setup.cfg's three source roots, and the
compiled collective core (runtime/dataparallel/csrc) when its sources exist."""

import os
from pathlib import Path

from setuptools import setup

ROOTS = {
    "shoal": "sdk/shoal",
    "shoal.launcher": "runtime/launcher",
    "shoal.dataparallel": "runtime/dataparallel",
    "shoal.modelparallel": "runtime/modelparallel",
    "shoal.profiler": "runtime/profiler",
    "shoal.containers": "containers",
    "smdistributed": "runtime/smdistributed",
}


def discover_packages():
    """Every directory with an __init__.py below each root, named by its mapping."""
    found = []
    for prefix, root in ROOTS.items():
        base = Path(root)
        if not (base / "__init__.py").exists():
            continue
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            found.append(".".join([prefix, *rel.parts]) if rel.parts else prefix)
    return found


def ext_modules():
    """The collective core's binding, defined next to its sources."""
    spec = Path("runtime/dataparallel/csrc/build_ext.py")
    if not spec.exists():
        return []
    scope = {"__file__": str(spec)}
    exec(compile(spec.read_text(), str(spec), "exec"), scope)
    return scope["extensions"]()


os.environ.setdefault("SHOAL_BUILDING", "1")
setup(package_dir=ROOTS, packages=discover_packages(), ext_modules=ext_modules())
