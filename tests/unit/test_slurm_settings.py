"""Slurm settings: parsed once from loose input, with the attrs-style messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from shoal.errors import ConfigError
from shoal.slurm.settings import SlurmSettings


def test_the_config_sections_keys_are_checked_and_partitions_map_instance_types(tmp_path):
    settings = SlurmSettings.from_mapping({
        "shared_dir": str(tmp_path), "partitions": {"ml.p4d.24xlarge": "gpu-a100"},
        "default_partition": "cpu", "account": "research", "qos": "normal",
        "sbatch_options": ["--constraint=ib", "--mail-type=END"]})
    assert settings.shared_dir == tmp_path
    assert settings.partition_for("ml.p4d.24xlarge") == "gpu-a100"
    assert settings.partition_for("ml.m5.xlarge") == "cpu"
    assert SlurmSettings(shared_dir=tmp_path).partition_for("ml.m5.xlarge") is None
    with pytest.raises(ConfigError, match=r"unknown 'slurm' setting\(s\) partiton \(known: "):
        SlurmSettings.from_mapping({"partiton": "gpu"})


@pytest.mark.parametrize("options,message", [
    (["constraint=ib"], "must read --name or --name=value"),
    (["--output=/tmp/x"], "may not set --output: Shoal sets it"),
    (["--wrap=rm -rf /"], "may not set --wrap"),
])
def test_extra_sbatch_options_are_options_and_never_what_shoal_sets(options, message):
    with pytest.raises(ConfigError, match=message):
        SlurmSettings(sbatch_options=options)


def test_names_are_slurm_names():
    with pytest.raises(ConfigError, match=r"'account' must be a Slurm name .* \(got 'a b'\)"):
        SlurmSettings(account="a b")
    with pytest.raises(ConfigError, match="'partitions' maps 'ml.m5.xlarge' to 'x;y'"):
        SlurmSettings(partitions={"ml.m5.xlarge": "x;y"})


def test_the_environment_names_the_shared_directory_and_partition(tmp_path):
    settings = SlurmSettings.from_env({"SHOAL_SLURM_SHARED_DIR": str(tmp_path / "s"),
                                       "SHOAL_SLURM_PARTITION": "batch"})
    assert settings.shared_dir == tmp_path / "s" and settings.default_partition == "batch"
    assert SlurmSettings.from_env({}).shared_dir.is_absolute()
    assert isinstance(SlurmSettings().shared_dir, Path)
