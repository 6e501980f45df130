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


def test_opt_ml_paths_move_under_the_base_dir(tmp_path):
    from shoal.launcher.paths import rebase, rebase_all

    base = str(tmp_path)
    assert rebase("/opt/ml/shared/model", base) == f"{base}/shared/model"
    assert rebase("/opt/ml", base) == base
    assert rebase("/opt/ml/model/", base) == f"{base}/model"
    # Not under /opt/ml, not a path, or the real /opt/ml: unchanged.
    for value in ("/opt/mlx/a", "/opt/ml/../../etc/passwd", "opt/ml/a", "s3://b/opt/ml", 3, None):
        assert rebase(value, base) == value
    assert rebase("/opt/ml/shared/model", "/opt/ml") == "/opt/ml/shared/model"
    moved, keys = rebase_all({"model_dir": "/opt/ml/shared/model", "lr": 0.1,
                              "out": "/opt/ml/output/data/x"}, base)  # fmt: skip
    assert moved == {"model_dir": f"{base}/shared/model", "lr": 0.1,
                     "out": f"{base}/output/data/x"}  # fmt: skip
    assert keys == ("model_dir", "out")
