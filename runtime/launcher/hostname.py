"""The ``gethostname`` shim preloaded into ranks (the toolkit's ``LD_PRELOAD=gethostname``).

SageMaker's toolkit preloads a small library so that ``gethostname()`` in a rank returns the
SageMaker host name (``algo-1``...) rather than the instance's. Shoal builds the same shim
from the C source below with the system C compiler, once per machine, into
``$SHOAL_CACHE_DIR`` (default ``~/.cache/shoal``, a directory only its owner can write):
``gethostname()`` then returns ``$SHOAL_HOST`` (which ``shoal-rank`` sets), and the real host
name when that is unset. Images can build it ahead with ``python -m shoal.launcher.hostname``.
Without a compiler there is no shim and the mpirun line has no ``LD_PRELOAD``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping

log = logging.getLogger(__name__)

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int gethostname(char *name, size_t len) {
    const char *host = getenv("SHOAL_HOST");
    if (host == NULL || host[0] == '\0') {
        int (*real)(char *, size_t) = (int (*)(char *, size_t))dlsym(RTLD_NEXT, "gethostname");
        if (real == NULL) { errno = ENOSYS; return -1; }
        return real(name, len);
    }
    size_t n = strlen(host);
    if (n + 1 > len) { errno = ENAMETOOLONG; return -1; }
    memcpy(name, host, n + 1);
    return 0;
}
"""


def cache_dir(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("SHOAL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "shoal")


def shim_path(environ: Mapping[str, str] = os.environ) -> str:
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    return os.path.join(cache_dir(environ), f"libshoalhostname-{digest}.so")


def _safe_dir(path: str) -> bool:
    st = os.stat(path)
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def ensure_shim(environ: Mapping[str, str] = os.environ) -> str | None:
    """The shim's path, building it when missing; None when it cannot be built."""
    path = shim_path(environ)
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        if not _safe_dir(directory):
            log.warning("%s is writable by others; not preloading a library from it", directory)
            return None
        if os.path.exists(path):
            return path
        compiler = shutil.which(environ.get("CC", "cc")) or shutil.which("gcc")
        if not compiler:
            return None
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            src, out = os.path.join(tmp, "gethostname.c"), os.path.join(tmp, "shim.so")
            with open(src, "w") as f:
                f.write(SOURCE)
            subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", out, src, "-ldl"],
                           check=True, capture_output=True, timeout=120)  # fmt: skip
            os.chmod(out, 0o755)
            os.replace(out, path)
        return path
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("cannot build the gethostname shim: %s", e)
        return None


if __name__ == "__main__":
    built = ensure_shim()
    print(built or "no shim (no C compiler?)")
    sys.exit(0 if built else 1)
