"""The gethostname shim preloaded into ranks."""

import os
import shutil
import socket
import subprocess
import sys

import pytest
from shoal.launcher.hostname import ensure_shim, shim_path

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")),
                              reason="no C compiler on this machine")  # fmt: skip


def _hostname(preload, **env):
    done = subprocess.run([sys.executable, "-c", "import socket; print(socket.gethostname())"],
                          env={**os.environ, "LD_PRELOAD": preload, **env},
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


@needs_cc
def test_shim_returns_shoal_host_else_the_real_name(tmp_path):
    env = {"SHOAL_CACHE_DIR": str(tmp_path / "cache")}
    path = ensure_shim(env)
    assert path == shim_path(env) and os.path.exists(path)
    assert ensure_shim(env) == path  # built once
    assert _hostname(path, SHOAL_HOST="algo-2") == "algo-2"
    env_without = {k: v for k, v in os.environ.items() if k != "SHOAL_HOST"}
    done = subprocess.run([sys.executable, "-c", "import socket; print(socket.gethostname())"],
                          env={**env_without, "LD_PRELOAD": path}, capture_output=True,
                          text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == socket.gethostname()


def test_shared_writable_cache_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    assert ensure_shim({"SHOAL_CACHE_DIR": str(cache)}) is None
    assert os.listdir(cache) == []
