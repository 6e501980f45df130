"""Hyperparameter decoding, splitting and the script's command line."""

from shoal.launcher import hyperparameters as hp


def test_split_framework_and_user_keys():
    framework, user = hp.split({"sagemaker_program": "t.py", "default_user_module_name": "m",
                                "_tuning_objective_metric": "loss", "lr": 1,
                                "mp_parameters": {"partitions": 2}})  # fmt: skip
    assert set(framework) == {"sagemaker_program", "default_user_module_name",
                              "_tuning_objective_metric"}  # fmt: skip
    assert user == {"lr": 1, "mp_parameters": {"partitions": 2}}
    assert hp.additional_framework_parameters(framework) == {}


def test_cmd_args_are_sorted_with_short_flags_and_mappings():
    args = hp.to_cmd_args({"z": 1, "batch_size": 32, "flag": True, "opts": {"b": 2, "a": 1},
                           "none": None, "list": [1, 2]})  # fmt: skip
    assert args == ["--batch_size", "32", "--flag", "True", "--list", "[1, 2]", "--none", "",
                    "--opts", "a=1,b=2", "-z", "1"]  # fmt: skip


def test_decode_keeps_non_json_values():
    assert hp.decode({"a": "1", "b": "[1,2]", "c": "x y", "d": 5}) == {
        "a": 1, "b": [1, 2], "c": "x y", "d": 5}
