"""The batch script of a training job: what sbatch is asked for, from the request alone."""

from __future__ import annotations

import subprocess

import pytest
from shoal.errors import ConfigError
from shoal.slurm import batch
from shoal.slurm.settings import SlurmSettings


def request(**resource) -> dict:
    return {"TrainingJobName": "my-job-1",
            "ResourceConfig": resource or {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 4},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600}}


def directives(text: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_one_whole_node_per_instance_in_the_instance_types_partition(tmp_path):
    settings = SlurmSettings(shared_dir=tmp_path, partitions={"ml.p4d.24xlarge": "p4d"},
                             account="acct", sbatch_options=["--constraint=efa"],
                             python="/shared/venv/bin/python")
    text = batch.script(request(), tmp_path / "my-job-1", settings)
    assert directives(text) == [
        "--job-name=my-job-1", "--nodes=4", "--ntasks-per-node=1", "--exclusive",
        "--wait-all-nodes=1", "--time=75",  # an hour of training and 15 minutes to upload
        f"--output={tmp_path}/my-job-1/logs.txt", "--open-mode=append",
        f"--chdir={tmp_path}/my-job-1", "--comment=shoal-training-job", "--no-requeue",
        "--partition=p4d", "--account=acct", "--constraint=efa"]
    assert text.splitlines()[-1] == (f"exec /shared/venv/bin/python -u -m shoal.local.runner "
                                     f"{tmp_path}/my-job-1")
    assert "export SHOAL_BACKEND=slurm" in text
    path = tmp_path / "s.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_a_job_that_checkpoints_may_be_requeued(tmp_path):
    req = {**request(), "CheckpointConfig": {"S3Uri": "s3://b/ckpt"}}
    assert "--requeue" in directives(batch.script(req, tmp_path / "j", SlurmSettings()))


def test_instance_groups_take_one_partition_or_are_refused(tmp_path):
    groups = [{"InstanceGroupName": "a", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
              {"InstanceGroupName": "b", "InstanceType": "ml.c5.18xlarge", "InstanceCount": 1}]
    req = request(InstanceGroups=groups)
    same = SlurmSettings(default_partition="all")
    assert "--nodes=3" in directives(batch.script(req, tmp_path / "j", same))
    split = SlurmSettings(partitions={"ml.p4d.24xlarge": "gpu", "ml.c5.18xlarge": "cpu"})
    with pytest.raises(ConfigError, match=r"different Slurm partitions \(\{'a': 'gpu', 'b': 'cpu'\}\)"):
        batch.script(req, tmp_path / "j", split)
    by_group = SlurmSettings(partitions={"a": "gpu", "b": "gpu"})
    assert "--partition=gpu" in directives(batch.script(req, tmp_path / "j", by_group))


def test_a_job_directory_with_spaces_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="may not contain spaces"):
        batch.script(request(), tmp_path / "a b" / "j", SlurmSettings())
