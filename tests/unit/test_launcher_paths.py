"""The /opt/ml layout."""

from shoal.launcher.paths import JobPaths


def test_layout(tmp_path):
    paths = JobPaths(str(tmp_path))
    assert paths.hyperparameters_file == str(tmp_path / "input/config/hyperparameters.json")
    assert paths.resource_config_file == str(tmp_path / "input/config/resourceconfig.json")
    assert paths.input_data_config_file == str(tmp_path / "input/config/inputdataconfig.json")
    assert paths.channel_dir("train") == str(tmp_path / "input/data/train")
    assert paths.failure_file == str(tmp_path / "output/failure")
    assert paths.checkpoints_dir == str(tmp_path / "checkpoints")
    paths.ensure_output_dirs()
    assert (tmp_path / "model").is_dir() and (tmp_path / "output/data").is_dir()
    assert (tmp_path / "code").is_dir()
