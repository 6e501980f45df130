"""The image's host-name library and entrypoint, compiled and run on this machine."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[2] / "containers" / "files"
REPORT = "import os, socket; print(socket.gethostname(), os.uname().nodename)"


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    out = tmp_path_factory.mktemp("shim") / "libshoal_hostname.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out),
                    str(FILES / "shoal_hostname.c")], check=True)
    return out


def names(env):
    done = subprocess.run([sys.executable, "-c", REPORT], env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.split()


def test_gethostname_and_uname_report_shoal_host(shim):
    env = {**os.environ, "LD_PRELOAD": str(shim), "SHOAL_HOST": "algo-7"}
    assert names(env) == ["algo-7", "algo-7"]


def test_without_shoal_host_the_real_name_is_kept(shim):
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_HOST"}
    real = names(env)
    assert names({**env, "LD_PRELOAD": str(shim)}) == real
    assert names({**env, "LD_PRELOAD": str(shim), "SHOAL_HOST": ""}) == real


def run_entrypoint(tmp_path, *command, **extra):
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "SAGEMAKER_BASE_DIR": str(tmp_path), **extra}
    done = subprocess.run(["bash", str(FILES / "shoal-entrypoint.sh"), *command], env=env,
                          capture_output=True, text=True, check=False)
    return done


def test_entrypoint_names_the_host_from_resourceconfig_and_runs_the_command(tmp_path):
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}))
    done = run_entrypoint(tmp_path, "sh", "-c", 'echo "$SHOAL_HOST $LD_PRELOAD $0 $1"', "a", "b")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["algo-2", "/usr/local/lib/libshoal_hostname.so", "a", "b"]


def test_entrypoint_keeps_a_given_host_and_defaults_to_train(tmp_path):
    done = run_entrypoint(tmp_path, "sh", "-c", 'echo "$SHOAL_HOST"', SHOAL_HOST="algo-9")
    assert done.stdout.strip() == "algo-9"
    no_config = run_entrypoint(tmp_path, "sh", "-c", 'echo "[${LD_PRELOAD:-}]"')
    assert no_config.stdout.strip() == "[]"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "train").write_text("#!/bin/sh\necho launcher ran\n")
    (bin_dir / "train").chmod(0o755)
    default = subprocess.run(["bash", str(FILES / "shoal-entrypoint.sh")], capture_output=True,
                             text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin",
                                             "SAGEMAKER_BASE_DIR": str(tmp_path)})
    assert default.stdout.strip() == "launcher ran"
