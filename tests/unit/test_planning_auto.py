"""``distribution="auto"``: planned at fit() from the estimator, before anything is uploaded."""

import logging

import boto3
import pytest
import shoal
from moto import mock_aws
from shoal import estimator as estimator_module
from shoal.errors import ValidationError
from shoal.planning import auto

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
GPT_18B = "transformer:layers=40,hidden=6144,heads=48,seq=2048,vocab=51200"
GPT_125M = "transformer:layers=12,hidden=768,heads=12,seq=1024,vocab=50257"


class Backend:
    def __init__(self):
        self.submitted = []

    def submit(self, request):
        self.submitted.append(request)
        return None


@pytest.fixture
def aws(monkeypatch, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    backend = Backend()
    monkeypatch.setattr(estimator_module, "backend_for", lambda instance_type, session: backend)
    with mock_aws():
        yield backend


def estimator(**changes):
    session = shoal.Session(boto_session=boto3.Session(region_name="us-west-2"))
    args = {"entry_point": "train.py", "source_dir": "code", "role": ROLE,
            "instance_count": 2, "instance_type": "ml.p4d.24xlarge",
            "framework_version": "1.13.1", "py_version": "py39", "distribution": "auto",
            "sagemaker_session": session}
    return shoal.PyTorch(**{**args, **changes})


def uploaded():
    s3 = boto3.client("s3", region_name="us-west-2")
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    return [o["Key"] for b in names for o in s3.list_objects_v2(Bucket=b).get("Contents", [])]


def test_fit_submits_the_planned_distribution_and_logs_why(aws, caplog):
    caplog.set_level(logging.INFO, logger="shoal.planning")
    est = estimator(model_description=GPT_18B, hyperparameters={"global_batch_size": 64,
                                                                 "bf16": True})
    est.fit(wait=False)
    request = aws.submitted[0]
    plan = est.strategy_plan
    assert est.distribution == plan.distribution
    hps = request["HyperParameters"]
    assert hps["sagemaker_mpi_enabled"] == "true"
    assert hps["sagemaker_mpi_num_of_processes_per_host"] == "8"
    assert '"bf16": true' in hps["mp_parameters"]
    assert any("distribution='auto'" in r.getMessage() and "fastest" in r.getMessage()
               for r in caplog.records)


def test_a_small_model_gets_the_data_parallel_library(aws):
    # fp32: in fp16, sharding the master copy's update is priced 6 % faster (strategy tests)
    est = estimator(model_description={"layers": 12, "hidden": 768, "heads": 12, "seq": 1024,
                                       "vocab": 50257, "global_batch": 64, "precision": "fp32"})
    request = est.build_request(None, "auto-dp")
    assert request["HyperParameters"]["sagemaker_distributed_dataparallel_enabled"] == "true"
    assert est.distribution == {"smdistributed": {"dataparallel": {"enabled": True}}}


def test_the_model_can_come_from_the_hyperparameters_smp_examples_use(aws):
    est = estimator(hyperparameters={"num_layers": 12, "hidden_width": 768, "num_heads": 12,
                                     "max_context_width": 1024, "vocab_size": 50257,
                                     "global_batch_size": 64, "fp16": 1})
    est.build_request(None, "auto-hp")
    assert est.strategy_plan.predicted["memory_gib"]["parameters"] > 0
    assert est.strategy_plan.distribution == est.distribution


def test_checkpointing_goes_to_the_jobs_environment(aws):
    est = estimator(model_description={"layers": 40, "hidden": 6144, "heads": 48, "seq": 2048,
                                       "vocab": 51200, "global_batch": 64,
                                       "precision": "bf16", "pins": {"checkpointing": True}},
                    environment={"MY_FLAG": "1"})
    request = est.build_request(None, "auto-ckpt")
    assert request["Environment"] == {"MY_FLAG": "1",
                                      "SHOAL_ACTIVATION_CHECKPOINTING": "blocks"}


def test_a_plan_that_cannot_fit_fails_before_any_upload(aws):
    est = estimator(model_description="transformer:layers=96,hidden=12288,heads=96,seq=2048,"
                                      "vocab=51200", hyperparameters={"global_batch_size": 64})
    with pytest.raises(ValidationError, match="smallest cluster that fits is"):
        est.fit(wait=False)
    assert aws.submitted == [] and uploaded() == []


def test_a_new_instance_count_is_planned_again(aws):
    est = estimator(model_description=GPT_125M, hyperparameters={"global_batch_size": 64})
    est.build_request(None, "auto-a")
    first = est.strategy_plan
    est.instance_count = 4
    est.build_request(None, "auto-b")
    assert est.strategy_plan is not first
    assert est.strategy_plan.degrees["data"] * est.strategy_plan.degrees["tensor"] \
        * est.strategy_plan.degrees["pipeline"] == 32


@pytest.mark.parametrize("changes,message", [
    ({}, "needs a model description"),
    ({"model_description": GPT_125M}, "needs the global batch"),
    ({"model_description": GPT_125M, "hyperparameters": {"global_batch_size": "many"}},
     "'global_batch' must be an int"),
    ({"model_description": {"layers": 2}, "hyperparameters": {"global_batch_size": 8}},
     "lacks hidden, heads, seq, vocab"),
])
def test_missing_planner_inputs_say_what_to_add(aws, changes, message):
    est = estimator(**changes)
    with pytest.raises(ValidationError, match=message):
        est.fit(wait=False)
    assert uploaded() == []


def test_auto_is_for_pytorch_only():
    with pytest.raises(ValidationError, match="'distribution' must be a dict"):
        shoal.TensorFlow(entry_point="train.py", role=ROLE, instance_count=1,
                         instance_type="ml.p3.2xlarge", framework_version="2.11",
                         py_version="py39", distribution="auto")


def test_planner_keys_are_not_taken_for_model_keys():
    plan = auto.plan_job({"layers": 12, "hidden": 768, "heads": 12, "seq": 1024,
                          "vocab": 50257, "global_batch": 64, "optimizer": "sgd"}, {},
                         "ml.p4d.24xlarge", 1)
    assert plan.predicted["memory_gib"]["optimizer_states"] == 0  # plain SGD keeps no state
