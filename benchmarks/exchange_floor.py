"""The two-core floor of a shared-memory allreduce (see exchange_floor.cpp).

Compiles exchange_floor.cpp with the system C++ compiler and runs it for a few
sizes. Its time is what the cheapest known two-process schedule costs on this
machine with every safety of a real collective removed; compare it with the
allreduce table (allreduce.py) to see how far a target is from the hardware.

    .venv/bin/python benchmarks/exchange_floor.py [--sizes 256K,1M,64M]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from allreduce import parse_size

HERE = Path(__file__).resolve().parent


def build(workdir: Path) -> Path:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        sys.exit("exchange_floor: no C++ compiler (g++) on PATH")
    binary = workdir / "exchange_floor"
    subprocess.run([compiler, "-O3", "-march=native", "-o", str(binary),
                    str(HERE / "exchange_floor.cpp")], check=True)
    return binary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256K,1M,64M")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shoal-floor-") as tmp:
        binary = build(Path(tmp))
        for size in args.sizes.split(","):
            subprocess.run([str(binary), str(parse_size(size))], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
