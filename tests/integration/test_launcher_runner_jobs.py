"""The non-MPI runners through ``train`` on simulated hosts: torchrun, one process per host."""

import json
import time

import pytest
from shoal.launcher.simulate import run_job

TORCHRUN_SCRIPT = """
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
rank = dist.get_rank()
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": dist.get_world_size(), "sum": t.item(),
               "local_rank": int(os.environ["LOCAL_RANK"]), "host": os.environ["SHOAL_HOST"],
               "job_id": os.environ["SHOAL_JOB_ID"]}, f)
dist.destroy_process_group()
"""

PROCESS_SCRIPT = """
import json, os, sys
with open(os.path.join(os.environ["SM_MODEL_DIR"], "process.json"), "w") as f:
    json.dump({"host": os.environ["SHOAL_HOST"], "tf_config": json.loads(os.environ["TF_CONFIG"]),
               "args": sys.argv[1:], "cwd": os.getcwd()}, f)
"""


def make_job(root, hosts, script, hps):
    for host in hosts:
        config = root / host / "input" / "config"
        config.mkdir(parents=True)
        (config / "resourceconfig.json").write_text(
            json.dumps({"current_host": host, "hosts": hosts}))
        (config / "hyperparameters.json").write_text(
            json.dumps({"sagemaker_program": json.dumps("train.py"), **hps}))
        (root / host / "code").mkdir()
        (root / host / "code" / "train.py").write_text(script)
    return root


@pytest.mark.torch
@pytest.mark.slow
def test_torchrun_two_hosts_two_processes(tmp_path):
    hosts = ["algo-1", "algo-2"]
    root = make_job(tmp_path / "job", hosts, TORCHRUN_SCRIPT, {
        "sagemaker_torch_distributed_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": "2",
        "sagemaker_job_name": json.dumps("tr")})  # fmt: skip
    assert run_job(str(root), hosts, timeout=300, env=None) == 0
    records = [json.loads(p.read_text()) for h in hosts for p in (root / h / "model").glob("*")]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3]
    for r in records:
        assert r["size"] == 4 and r["sum"] == 10.0
        assert r["host"] == hosts[r["rank"] // 2] and r["local_rank"] == r["rank"] % 2


def test_one_process_per_host_with_multi_worker_mirrored_tf_config(tmp_path):
    hosts = ["algo-1", "algo-2"]
    root = make_job(tmp_path / "job", hosts, PROCESS_SCRIPT, {
        "sagemaker_multi_worker_mirrored_strategy_enabled": "true", "batch-size": "8"})
    assert run_job(str(root), hosts, timeout=120) == 0
    for i, host in enumerate(hosts):
        rec = json.loads((root / host / "model" / "process.json").read_text())
        assert rec["host"] == host
        assert rec["args"] == ["--batch-size", "8"]
        assert rec["cwd"] == str(root / host / "code")
        assert rec["tf_config"]["task"] == {"index": i, "type": "worker"}
        assert (root / host / "output" / "success").exists()


@pytest.mark.tensorflow
@pytest.mark.slow
def test_a_dead_parameter_server_fails_the_job(tmp_path):
    """The master's script kills its host's parameter server and then waits, as a worker
    blocked on a dead server would: the launcher ends the job and names the server."""
    pytest.importorskip("tensorflow")
    hosts = ["algo-1", "algo-2"]
    script = ("import os, time, psutil\n"
              "if os.environ['SHOAL_HOST'] == 'algo-1':\n"
              "    time.sleep(2)\n"
              "    for p in psutil.Process(os.getppid()).children():\n"
              "        if 'tf.distribute.Server' in ' '.join(p.cmdline()):\n"
              "            p.kill()\n"
              "time.sleep(120)\n")  # fmt: skip
    root = make_job(tmp_path / "job", hosts, script,
                    {"sagemaker_parameter_server_enabled": "true"})
    start = time.monotonic()
    assert run_job(str(root), hosts, timeout=300) != 0
    assert time.monotonic() - start < 90
    text = (root / "algo-1" / "output" / "failure").read_text()
    assert "The parameter server (pid" in text and "exited with code -9" in text, text


def test_single_host_script_failure_writes_the_failure_file(tmp_path):
    root = make_job(tmp_path / "job", ["algo-1"], "import sys\nsys.exit('no data found')\n", {})
    assert run_job(str(root), ["algo-1"], timeout=120) == 1
    text = (root / "algo-1" / "output" / "failure").read_text()
    assert text.startswith("Training process exited with code 1. no data found")


@pytest.mark.tensorflow
@pytest.mark.slow
def test_parameter_server_hosts_run_a_server_and_a_worker(tmp_path):
    """Each simulated host's parameter server listens on its own loopback address (both
    would bind algo-N:2223 on one machine otherwise), and every task reaches every server."""
    pytest.importorskip("tensorflow")
    hosts = ["algo-1", "algo-2"]
    # A host's servers end with its training, so each task waits, as real training would,
    # until every task has reached every server (markers in a folder both hosts share).
    sync = tmp_path / "reached"
    sync.mkdir()
    script = ("import json, os, socket, time\n"
              "c = json.loads(os.environ['TF_CONFIG'])\n"
              "deadline = time.time() + 120\n"
              "for address in c['cluster']['ps']:\n"
              "    ip, port = address.rsplit(':', 1)\n"
              "    while True:\n"
              "        try:\n"
              "            socket.create_connection((ip, int(port)), timeout=1).close(); break\n"
              "        except OSError:\n"
              "            assert time.time() < deadline, address; time.sleep(0.5)\n"
              f"sync = {str(sync)!r}\n"
              "open(os.path.join(sync, os.environ['SHOAL_HOST']), 'w').close()\n"
              "while len(os.listdir(sync)) < 2:\n"
              "    assert time.time() < deadline, os.listdir(sync); time.sleep(0.2)\n"
              "open(os.path.join(os.environ['SM_MODEL_DIR'], 'tf_config.json'), 'w')"
              ".write(json.dumps(c))\n")  # fmt: skip
    root = make_job(tmp_path / "job", hosts, script,
                    {"sagemaker_parameter_server_enabled": "true"})
    assert run_job(str(root), hosts, timeout=300) == 0
    configs = [json.loads((root / h / "model" / "tf_config.json").read_text()) for h in hosts]
    assert [c["task"] for c in configs] == [{"index": 0, "type": "master"},
                                            {"index": 0, "type": "worker"}]
    cluster = configs[0]["cluster"]
    assert configs[1]["cluster"] == cluster
    addresses = cluster["master"] + cluster["worker"] + cluster["ps"]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)
