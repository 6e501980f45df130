"""Estimator behaviour: arguments, job resolution, staging and submission through a backend."""

import re
import warnings

import boto3
import pytest
import shoal
from moto import mock_aws
from shoal import estimator as estimator_module
from shoal.errors import ImageError, InputError, ValidationError

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
PT = {"entry_point": "train.py", "source_dir": "code", "role": ROLE, "instance_count": 1,
      "instance_type": "ml.c5.xlarge", "framework_version": "1.13.1", "py_version": "py39"}


class FakeJob:
    def __init__(self, request):
        self.name = request["TrainingJobName"]
        self.request = request
        self.waited_with = None

    def wait(self, logs="All"):
        self.waited_with = logs

    model_data = "s3://bucket/job/output/model.tar.gz"


class FakeBackend:
    def __init__(self):
        self.submitted = []

    def submit(self, request):
        self.submitted.append(FakeJob(request))
        return self.submitted[-1]


@pytest.fixture
def aws(monkeypatch, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    backend = FakeBackend()
    monkeypatch.setattr(estimator_module, "backend_for", lambda instance_type, session: backend)
    with mock_aws():
        yield backend


def session():
    return shoal.Session(boto_session=boto3.Session(region_name="us-west-2"))


def pytorch(**changes):
    return shoal.PyTorch(sagemaker_session=session(), **{**PT, **changes})


def bucket_keys(bucket):
    s3 = boto3.client("s3", region_name="us-west-2")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_fit_stages_the_code_where_the_request_says_and_submits(aws):
    est = pytorch()
    est.fit("s3://data/train", job_name="job-1", logs="None")
    job = aws.submitted[0]
    assert job.waited_with == "None"
    assert est.latest_training_job is job
    submit_dir = job.request["HyperParameters"]["sagemaker_submit_directory"]
    assert submit_dir == '"s3://sagemaker-us-west-2-123456789012/job-1/source/sourcedir.tar.gz"'
    assert bucket_keys("sagemaker-us-west-2-123456789012") == ["job-1/source/sourcedir.tar.gz"]
    assert est.model_data == FakeJob.model_data


def test_fit_without_wait_does_not_follow(aws):
    est = pytorch()
    est.fit(job_name="job-2", wait=False)
    assert aws.submitted[0].waited_with is None


def test_an_invalid_job_uploads_nothing(aws):
    est = pytorch()
    with pytest.raises(InputError, match="file:// URI only in local mode"):
        est.fit("file:///data", job_name="job-3")
    s3 = boto3.client("s3", region_name="us-west-2")
    assert s3.list_buckets()["Buckets"] == []
    assert aws.submitted == []


def test_generated_job_name_has_v2_form(aws):
    est = pytorch()
    name = est._prepare_for_training()
    assert re.fullmatch(r"shoal-pytorch-training-\d{4}(-\d{2}){5}-\d{3}", name)
    long = pytorch(base_job_name="b" * 60)._prepare_for_training()
    assert len(long) == 63 and long.startswith("b" * 39 + "-")


def test_invalid_job_name_is_refused(aws):
    with pytest.raises(ValidationError, match="'job_name' must match regex"):
        pytorch().build_request(job_name="under_score")


def test_v1_argument_names_warn_and_apply(aws):
    kwargs = {k: v for k, v in PT.items() if k not in ("instance_count", "instance_type")}
    with pytest.warns(DeprecationWarning) as record:
        est = shoal.PyTorch(sagemaker_session=session(), train_instance_count=2,
                            train_instance_type="ml.p3.16xlarge", train_max_run=100, **kwargs)
    assert sorted(str(w.message).split(" is ")[0] for w in record) == [
        "'train_instance_count'", "'train_instance_type'", "'train_max_run'"]
    assert {w.filename for w in record} == {__file__}
    assert (est.instance_count, est.instance_type, est.max_run) == (2, "ml.p3.16xlarge", 100)


def test_unknown_arguments_are_refused(aws):
    with pytest.raises(TypeError, match="unexpected keyword arguments: instance_countt"):
        pytorch(instance_countt=2)


def test_attribute_assignment_is_validated(aws):
    est = pytorch()
    est.max_run = 60
    assert est.config.max_run == 60
    with pytest.raises(ValidationError, match="'max_run' must be >= 1 \\(got 0\\)"):
        est.max_run = 0


def test_generic_estimator_needs_an_image_and_encodes_like_v2(aws):
    with pytest.raises(ValidationError, match="'image_uri' is required"):
        shoal.Estimator(role=ROLE, instance_count=1, instance_type="ml.m5.xlarge",
                        sagemaker_session=session())
    est = shoal.Estimator("img:1", ROLE, 1, "ml.m5.xlarge", sagemaker_session=session(),
                          hyperparameters={"k": 3, "name": "x"})
    request = est.build_request(job_name="job-4")
    assert request["HyperParameters"] == {"k": "3", "name": "x"}
    assert request["AlgorithmSpecification"]["TrainingImage"] == "img:1"
    assert est._prepare_for_training().startswith("img-")


def test_framework_entry_point_rules(aws):
    with pytest.raises(ValidationError, match="'entry_point' must be a local file"):
        pytorch(entry_point="s3://b/train.py")
    with pytest.raises(ValidationError, match="'entry_point' is required"):
        pytorch(entry_point=None)


def test_unsupported_framework_version_lists_supported_ones(aws):
    with pytest.raises(ImageError, match=r"no Shoal image for pytorch 2\.1 py310; supported: "
                                         r"1\.10\.0 \(py38\), .*, 1\.13\.1 \(py39\), 2\.0\.0 \(py310\), "
                                         r"2\.0\.1 \(py310\) \(or pass image_uri=\)"):
        pytorch(framework_version="2.1", py_version="py310")


def test_role_name_is_expanded_through_iam(aws):
    iam = boto3.client("iam", region_name="us-west-2")
    arn = iam.create_role(RoleName="TrainRole", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    assert pytorch(role="TrainRole").build_request(job_name="j")["RoleArn"] == arn


def test_model_data_needs_a_job(aws):
    with pytest.raises(ValidationError, match="call fit\\(\\) first"):
        _ = pytorch().model_data


def test_network_isolation_ships_the_code_as_a_channel(aws):
    request = pytorch(enable_network_isolation=True).build_request(job_name="job-5")
    assert request["HyperParameters"]["sagemaker_submit_directory"] == \
        '"/opt/ml/input/data/code/sourcedir.tar.gz"'
    code = request["InputDataConfig"][-1]
    assert code["ChannelName"] == "code"
    assert code["DataSource"]["S3DataSource"]["S3Uri"] == \
        "s3://sagemaker-us-west-2-123456789012/job-5/source/sourcedir.tar.gz"


@pytest.mark.parametrize("changes, bucket, key, kms, owner", [
    ({}, "sagemaker-us-west-2-123456789012", "j/source/sourcedir.tar.gz", None,
     "123456789012"),
    ({"output_path": "s3://out/p", "output_kms_key": "alias/k"}, "out",
     "j/source/sourcedir.tar.gz", "alias/k", None),
    ({"output_path": "s3://out/p", "output_kms_key": "alias/k",
      "code_location": "s3://code/pre"}, "code", "pre/j/source/sourcedir.tar.gz", None, None),
    ({"output_path": "s3://out/p", "output_kms_key": "alias/k",
      "code_location": "s3://out/pre"}, "out", "pre/j/source/sourcedir.tar.gz", "alias/k", None),
])
def test_code_destination_encryption_and_owner_check(aws, monkeypatch, changes, bucket, key,
                                                     kms, owner):
    from shoal import staging

    calls = []
    monkeypatch.setattr(staging, "stage_code", lambda client, **kw: calls.append(kw))
    pytorch(**changes).fit("s3://d/t", job_name="j")
    assert (calls[0]["bucket"], calls[0]["key"], calls[0]["kms_key"],
            calls[0]["expected_owner"]) == (bucket, key, kms, owner)


def test_local_mode_needs_no_aws(monkeypatch, tmp_path):
    class NoAWS:
        def __getattr__(self, name):
            raise AssertionError(f"AWS called: {name}")

    monkeypatch.chdir(tmp_path)
    (tmp_path / "code").mkdir()
    local_session = shoal.Session(sts_client=NoAWS(), s3_client=NoAWS(), iam_client=NoAWS(),
                                  sagemaker_client=NoAWS(), local_mode=True)
    est = shoal.PyTorch(sagemaker_session=local_session, **{**PT, "instance_type": "local",
                                                            "role": "LocalRole"})
    request = est.build_request("file:///data", job_name="local-1")
    assert request["AlgorithmSpecification"]["TrainingImage"] == \
        "shoal-pytorch-training:1.13.1-cpu-py39"
    assert request["HyperParameters"]["sagemaker_submit_directory"] == \
        f'"file://{tmp_path / "code"}"'
    assert request["OutputDataConfig"]["S3OutputPath"] == f"file://{tmp_path / 'shoal-output'}"
    assert request["InputDataConfig"][0]["DataSource"] == {"FileDataSource": {
        "FileDataDistributionType": "FullyReplicated", "FileUri": "file:///data"}}


def test_set_hyperparameters_are_sent_json_encoded(aws):
    est = pytorch(hyperparameters={"a": 1})
    est.set_hyperparameters(b="two", c=[1, 2])
    hps = est.build_request(job_name="j")["HyperParameters"]
    assert (hps["a"], hps["b"], hps["c"]) == ("1", '"two"', "[1, 2]")


def test_porting_is_a_change_of_imports():
    import shoal.inputs

    for name in ("PyTorch", "TensorFlow", "Estimator", "InstanceGroup", "Session"):
        assert getattr(shoal, name).__name__ == name
    assert {"TrainingInput", "FileSystemInput"} <= set(dir(shoal.inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shoal.TrainingInput is shoal.inputs.TrainingInput


def test_a_role_that_is_not_an_arn_after_expansion_is_refused(aws, monkeypatch):
    est = pytorch(role="TrainRole")
    monkeypatch.setattr(est.sagemaker_session, "expand_role", lambda role: "TrainRole")
    with pytest.raises(ValidationError, match="'role' must match regex"):
        est.build_request(job_name="j")


def test_fit_submits_through_the_sagemaker_backend(monkeypatch, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        est = pytorch()
        est.fit({"train": "s3://data/train"}, wait=False, job_name="moto-job")
        described = est.sagemaker_session.sagemaker_client.describe_training_job(
            TrainingJobName="moto-job")
        assert est.latest_training_job.name == "moto-job"
        assert described["HyperParameters"]["sagemaker_program"] == '"train.py"'
        assert described["AlgorithmSpecification"]["TrainingImage"] == \
            "123456789012.dkr.ecr.us-west-2.amazonaws.com/shoal-pytorch-training:1.13.1-cpu-py39"


def test_secrets_are_refused_at_construction_and_after_set_hyperparameters(aws):
    from shoal.errors import SecretValueError

    with pytest.raises(SecretValueError, match=r"hyperparameters\['api_key'\]"):
        pytorch(hyperparameters={"api_key": "sk-live-123"})
    with pytest.raises(SecretValueError, match=r"environment\['GITHUB_TOKEN'\]"):
        pytorch(environment={"GITHUB_TOKEN": "ghp_" + "x1" * 18})
    est = pytorch()
    est.set_hyperparameters(password="hunter2")
    with pytest.raises(SecretValueError, match=r"hyperparameters\['password'\]"):
        est.build_request(job_name="j")
    assert pytorch(hyperparameters={"api_key": "sk"}, allow_secrets=True).build_request(
        job_name="j")["HyperParameters"]["api_key"] == '"sk"'


def test_image_uri_length_is_checked(aws):
    with pytest.raises(ValidationError, match="'image_uri' must be at most 255 characters"):
        shoal.Estimator("i" * 256, ROLE, 1, "ml.m5.xlarge", sagemaker_session=session())


def test_missing_code_is_refused_before_any_job_or_upload_on_sagemaker(monkeypatch, tmp_path):
    from shoal.errors import SourceCodeError

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        client = session().sagemaker_client
        for changes, message in [
            ({"entry_point": "trian.py"}, "'entry_point' names no file: 'trian.py' not found "
                                          "in source_dir 'code' (did you mean 'train.py'?)"),
            ({"source_dir": "nocode"}, "'source_dir' is not a directory: 'nocode'")]:
            est = pytorch(**changes)
            with pytest.raises(SourceCodeError) as caught:
                est.fit({"train": "s3://data/train"}, wait=False, job_name="refused-job")
            assert str(caught.value).startswith(message)
            assert est.latest_training_job is None
            assert client.list_training_jobs()["TrainingJobSummaries"] == []
            assert s3.list_buckets()["Buckets"] == []
        # what v2 takes: an S3 archive (nothing looked for, nothing uploaded), a lone path
        pytorch(source_dir="s3://code/sourcedir.tar.gz", entry_point="missing.py").fit(
            wait=False, job_name="s3-code")
        assert s3.list_buckets()["Buckets"] == []
        pytorch(source_dir=None, entry_point="code/train.py").fit(wait=False, job_name="lone")
        jobs = client.list_training_jobs()["TrainingJobSummaries"]
        assert sorted(j["TrainingJobName"] for j in jobs) == ["lone", "s3-code"]
        assert bucket_keys("sagemaker-us-west-2-123456789012") == ["lone/source/sourcedir.tar.gz"]


@pytest.mark.parametrize("changes, message", [
    ({"entry_point": "trian.py"}, "'entry_point' names no file: 'trian.py' not found"),
    ({"source_dir": "nocode"}, "'source_dir' is not a directory: 'nocode'"),
    ({"source_dir": None, "entry_point": "trian.py"}, "'entry_point' names no file"),
])
def test_missing_code_leaves_no_local_job_behind(monkeypatch, tmp_path, changes, message):
    from shoal.errors import SourceCodeError

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    est = shoal.PyTorch(**{**PT, "instance_type": "local", "role": "LocalRole", **changes})
    with pytest.raises(SourceCodeError, match=re.escape(message)):
        est.fit(wait=False, job_name="refused-local-job")
    assert est.latest_training_job is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["code"]  # no job, record or output

