"""The SageMaker API's training-job operations over the local backend's job directories:
DescribeTrainingJob and ListTrainingJobs answer with the API's members only, list filters,
sorting and paging, StopTrainingJob of an ended job, tags by the job's ARN, and what
CreateTrainingJob refuses before it submits anything. No job is started here."""

from __future__ import annotations

import datetime as dt

import pytest
from shoal.local import state
from shoal.server import images
from shoal.server.api_errors import ResourceInUse, ResourceNotFound, ValidationException
from shoal.server.protocol import service_model
from shoal.server.training_jobs import TrainingJobs

T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
DLC_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.0.1-cpu-py310"


def members(shape: str) -> set[str]:
    return set(service_model("sagemaker").shape_for(shape).members)


def request(name: str, image: str = "x") -> dict:
    return {"TrainingJobName": name,
            "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
            "RoleArn": "arn:aws:iam::111122223333:role/R",
            "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
            "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1,
                               "VolumeSizeInGB": 30}}


def make_job(root, name: str, minutes: int = 0, status: str | None = None, **extra) -> dict:
    """A job directory as the local backend writes it, created ``minutes`` after T0."""
    record = state.initial(request(name), "us-east-1")
    record["CreationTime"] = record["LastModifiedTime"] = T0 + dt.timedelta(minutes=minutes)
    if status == "Completed":
        record = state.transition(record, "Training")
    if status:
        record = state.transition(record, status)
    record.update(extra)
    (root / name).mkdir(parents=True)
    state.write(root / name / "job.json", record)
    return record


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    api = TrainingJobs(tmp_path / "jobs", region="us-east-1")

    def no_submit(params):
        raise AssertionError(f"a job was submitted: {params['TrainingJobName']}")

    monkeypatch.setattr(api.backend, "submit", no_submit)
    return api


@pytest.fixture
def listed(jobs):
    """Four jobs: alpha (oldest), Beta-Run, gamma, delta-run (newest)."""
    make_job(jobs.root, "alpha", 0, "Completed")
    make_job(jobs.root, "Beta-Run", 10, "Training")
    make_job(jobs.root, "gamma", 20, "Failed")
    make_job(jobs.root, "delta-run", 30, "Completed")
    return jobs


def names(out: dict) -> list[str]:
    return [s["TrainingJobName"] for s in out["TrainingJobSummaries"]]


# -- DescribeTrainingJob ---------------------------------------------------------------------
def test_describe_answers_with_the_responses_members_only(jobs):
    make_job(jobs.root, "my-job", status="Completed", ShoalSupervisorPid=1234)
    out = jobs.DescribeTrainingJob({"TrainingJobName": "my-job"})
    assert out["TrainingJobName"] == "my-job"
    assert out["TrainingJobStatus"] == "Completed" and out["SecondaryStatus"] == "Completed"
    assert out["TrainingJobArn"] == "arn:aws:sagemaker:us-east-1:000000000000:training-job/my-job"
    assert out["ResourceConfig"]["InstanceCount"] == 1
    assert isinstance(out["CreationTime"], dt.datetime)
    assert "ShoalSupervisorPid" not in out
    assert set(out) <= members("DescribeTrainingJobResponse")


def test_describe_finds_a_job_whatever_the_case(jobs):
    make_job(jobs.root, "Mixed-Case")
    assert jobs.DescribeTrainingJob({"TrainingJobName": "mixed-case"})["TrainingJobName"] == "Mixed-Case"


def test_describe_of_an_unknown_job(jobs):
    with pytest.raises(ValidationException) as caught:
        jobs.DescribeTrainingJob({"TrainingJobName": "nobody"})
    assert caught.value.message == "Requested resource not found."


def test_a_directory_without_job_json_is_no_job(jobs):
    (jobs.root / "half-made").mkdir(parents=True)
    with pytest.raises(ValidationException):
        jobs.DescribeTrainingJob({"TrainingJobName": "half-made"})
    assert jobs.ListTrainingJobs({}) == {"TrainingJobSummaries": []}


# -- ListTrainingJobs ------------------------------------------------------------------------
def test_list_with_no_root_is_empty(jobs):
    assert not jobs.root.exists()
    assert jobs.ListTrainingJobs({}) == {"TrainingJobSummaries": []}


def test_list_defaults_to_creation_time_ascending(listed):
    out = listed.ListTrainingJobs({})
    assert names(out) == ["alpha", "Beta-Run", "gamma", "delta-run"]
    assert "NextToken" not in out


def test_list_creation_time_descending(listed):
    out = listed.ListTrainingJobs({"SortBy": "CreationTime", "SortOrder": "Descending"})
    assert names(out) == ["delta-run", "gamma", "Beta-Run", "alpha"]


def test_list_by_name_descending(listed):
    out = listed.ListTrainingJobs({"SortBy": "Name", "SortOrder": "Descending"})
    assert names(out) == ["gamma", "delta-run", "alpha", "Beta-Run"]  # by code point, as given


def test_list_by_status(listed):
    out = listed.ListTrainingJobs({"SortBy": "Status"})
    assert [s["TrainingJobStatus"] for s in out["TrainingJobSummaries"]] == [
        "Completed", "Completed", "Failed", "InProgress"]


def test_list_status_equals(listed):
    assert names(listed.ListTrainingJobs({"StatusEquals": "Completed"})) == ["alpha", "delta-run"]
    assert names(listed.ListTrainingJobs({"StatusEquals": "InProgress"})) == ["Beta-Run"]
    assert names(listed.ListTrainingJobs({"StatusEquals": "Stopped"})) == []


def test_list_name_contains_ignores_case(listed):
    assert names(listed.ListTrainingJobs({"NameContains": "RUN"})) == ["Beta-Run", "delta-run"]


def test_list_creation_time_after_an_epoch_number(listed):
    after = (T0 + dt.timedelta(minutes=10)).timestamp()
    assert names(listed.ListTrainingJobs({"CreationTimeAfter": after})) == ["gamma", "delta-run"]
    before = (T0 + dt.timedelta(minutes=20)).timestamp()
    assert names(listed.ListTrainingJobs({"CreationTimeBefore": before})) == ["alpha", "Beta-Run"]


def test_list_pages_with_next_token(listed):
    first = listed.ListTrainingJobs({"MaxResults": 3})
    assert names(first) == ["alpha", "Beta-Run", "gamma"] and first["NextToken"]
    second = listed.ListTrainingJobs({"MaxResults": 3, "NextToken": first["NextToken"]})
    assert names(second) == ["delta-run"]
    assert "NextToken" not in second


def test_list_page_that_ends_exactly_has_no_next_token(listed):
    assert "NextToken" not in listed.ListTrainingJobs({"MaxResults": 4})


def test_list_with_a_bad_next_token(listed):
    with pytest.raises(ValidationException):
        listed.ListTrainingJobs({"NextToken": "not-a-token"})


def test_summaries_hold_only_summary_members(listed):
    summaries = listed.ListTrainingJobs({})["TrainingJobSummaries"]
    allowed = members("TrainingJobSummary")
    assert all(set(s) <= allowed for s in summaries)
    assert all({"TrainingJobName", "TrainingJobArn", "CreationTime", "TrainingJobStatus"} <= set(s)
               for s in summaries)
    assert "ResourceConfig" not in summaries[0]
    assert "TrainingEndTime" in summaries[0]  # alpha has ended


# -- StopTrainingJob -------------------------------------------------------------------------
@pytest.mark.parametrize("status", ["Completed", "Failed", "Stopped"])
def test_stopping_an_ended_job_is_refused(jobs, status):
    make_job(jobs.root, "done", status=status)
    with pytest.raises(ValidationException) as caught:
        jobs.StopTrainingJob({"TrainingJobName": "done"})
    assert status in caught.value.message


def test_stopping_an_unknown_job(jobs):
    with pytest.raises(ValidationException) as caught:
        jobs.StopTrainingJob({"TrainingJobName": "nobody"})
    assert caught.value.message == "Requested resource not found."


# -- tags ------------------------------------------------------------------------------------
def test_tags_round_trip_by_arn(jobs):
    arn = make_job(jobs.root, "Tagged-Job")["TrainingJobArn"]
    assert arn.endswith(":training-job/tagged-job")
    added = jobs.AddTags({"ResourceArn": arn, "Tags": [{"Key": "team", "Value": "ml"},
                                                       {"Key": "stage", "Value": "dev"}]})
    assert added["Tags"] == [{"Key": "team", "Value": "ml"}, {"Key": "stage", "Value": "dev"}]
    jobs.AddTags({"ResourceArn": arn, "Tags": [{"Key": "stage", "Value": "prod"}]})
    assert jobs.ListTags({"ResourceArn": arn}) == {
        "Tags": [{"Key": "team", "Value": "ml"}, {"Key": "stage", "Value": "prod"}]}
    assert jobs.DeleteTags({"ResourceArn": arn, "TagKeys": ["team", "absent"]}) == {}
    assert jobs.ListTags({"ResourceArn": arn}) == {"Tags": [{"Key": "stage", "Value": "prod"}]}


def test_list_tags_pages(jobs):
    arn = make_job(jobs.root, "many-tags")["TrainingJobArn"]
    jobs.AddTags({"ResourceArn": arn, "Tags": [{"Key": f"k{n}", "Value": str(n)} for n in range(3)]})
    first = jobs.ListTags({"ResourceArn": arn, "MaxResults": 2})
    assert [t["Key"] for t in first["Tags"]] == ["k0", "k1"]
    second = jobs.ListTags({"ResourceArn": arn, "MaxResults": 2, "NextToken": first["NextToken"]})
    assert [t["Key"] for t in second["Tags"]] == ["k2"] and "NextToken" not in second


def test_a_job_has_at_most_fifty_tags(jobs):
    arn = make_job(jobs.root, "tag-limit")["TrainingJobArn"]
    jobs.AddTags({"ResourceArn": arn, "Tags": [{"Key": f"k{n}", "Value": ""} for n in range(50)]})
    with pytest.raises(ValidationException):
        jobs.AddTags({"ResourceArn": arn, "Tags": [{"Key": "one-more", "Value": ""}]})
    assert len(jobs.ListTags({"ResourceArn": arn, "MaxResults": 100})["Tags"]) == 50


def test_tags_of_an_unknown_arn(jobs):
    make_job(jobs.root, "known")
    for arn in ("arn:aws:sagemaker:us-east-1:000000000000:training-job/unknown",
                "arn:aws:sagemaker:eu-west-1:000000000000:training-job/known",  # not its ARN
                "not-an-arn"):
        with pytest.raises(ResourceNotFound) as caught:
            jobs.ListTags({"ResourceArn": arn})
        assert caught.value.code == "ResourceNotFound"


@pytest.mark.parametrize("name", ["../outside", "inside/../../outside", "..%2Foutside"])
def test_an_arn_that_climbs_out_of_the_root_is_not_found(jobs, name):
    make_job(jobs.root, "inside")
    arn = f"arn:aws:sagemaker:us-east-1:000000000000:training-job/{name}"
    outside = jobs.root.parent / "outside"
    outside.mkdir()
    record = state.initial(request("outside"), "us-east-1")
    record["TrainingJobArn"] = arn  # even a record that claims the ARN is not reached
    state.write(outside / "job.json", record)
    with pytest.raises(ResourceNotFound):
        jobs.AddTags({"ResourceArn": arn, "Tags": [{"Key": "k", "Value": "v"}]})
    with pytest.raises(ResourceNotFound):
        jobs.ListTags({"ResourceArn": arn})
    assert not (outside / "tags.json").exists()


# -- CreateTrainingJob's refusals ------------------------------------------------------------
def test_create_with_a_custom_image_is_refused_before_anything_is_written(jobs):
    params = request("custom-algo", "111122223333.dkr.ecr.us-east-1.amazonaws.com/my-algo:latest")
    with pytest.raises(ValidationException) as caught:
        jobs.CreateTrainingJob(params)
    assert "my-algo:latest" in caught.value.message
    assert not jobs.root.exists() or list(jobs.root.iterdir()) == []


def test_create_without_an_image_is_refused(jobs):
    params = request("no-image")
    del params["AlgorithmSpecification"]["TrainingImage"]
    with pytest.raises(ValidationException):
        jobs.CreateTrainingJob(params)
    assert not (jobs.root / "no-image").exists()


@pytest.mark.parametrize("name", ["existing-job", "EXISTING-JOB", "Existing-Job"])
def test_create_with_an_existing_name_in_any_case_is_in_use(jobs, name):
    record = make_job(jobs.root, "existing-job", status="Completed")
    assert images.recognise(DLC_IMAGE).source == "dlc"  # refused for its name, not its image
    with pytest.raises(ResourceInUse) as caught:
        jobs.CreateTrainingJob(request(name, DLC_IMAGE))
    assert record["TrainingJobArn"] in caught.value.message
    assert [p.name for p in jobs.root.iterdir()] == ["existing-job"]
    assert state.read(jobs.root / "existing-job" / "job.json")["TrainingJobStatus"] == "Completed"


def test_a_name_whose_folder_is_taken_in_a_file_output_path_is_in_use(tmp_path, monkeypatch):
    from shoal.local import process

    monkeypatch.setattr(process, "spawn_runner", lambda *a: pytest.fail("a job was started"))
    left = tmp_path / "out" / "old-job" / "output"
    left.mkdir(parents=True)  # by a job of another root, or one whose record was deleted
    params = {**request("old-job", DLC_IMAGE),
              "OutputDataConfig": {"S3OutputPath": (tmp_path / "out").as_uri()}}
    with pytest.raises(ResourceInUse, match="left its artifacts there"):
        TrainingJobs(tmp_path / "jobs").CreateTrainingJob(params)
    assert not (tmp_path / "jobs" / "old-job").exists()
    assert [p.name for p in left.parent.iterdir()] == ["output"]


def test_a_submission_that_never_finished_still_takes_its_name(tmp_path):
    (tmp_path / "half-made").mkdir()  # a job directory without its record
    with pytest.raises(ResourceInUse, match=r"already exists \(half-made\)"):
        TrainingJobs(tmp_path).CreateTrainingJob(request("half-made", DLC_IMAGE))


# -- relative file:// URIs -------------------------------------------------------------------
class Submitted(Exception):
    pass


def test_relative_file_uris_are_submitted_under_the_servers_directory(tmp_path, monkeypatch):
    """The job runs in a directory of its own: ``file://./code`` and ``file://out`` reach it
    as absolute URIs under where the server was started; absolute ones and the script's own
    values are left as they were."""
    monkeypatch.chdir(tmp_path)
    api = TrainingJobs(tmp_path / "jobs")
    submitted = []

    def capture(params):
        submitted.append(params)
        raise Submitted

    monkeypatch.setattr(api.backend, "submit", capture)
    params = request("relative-uris", DLC_IMAGE)
    params["OutputDataConfig"]["S3OutputPath"] = "file://out"
    params["InputDataConfig"] = [
        {"ChannelName": "train", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "file://./data/my%20train"}}},
        {"ChannelName": "test", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "file:///abs/test"}}}]
    params["HyperParameters"] = {"sagemaker_submit_directory": '"file://./code"',
                                 "where": '"file://./elsewhere"'}
    params["Environment"] = {"DATA": "file://./data"}
    with pytest.raises(Submitted):
        api.CreateTrainingJob(params)
    (sent,) = submitted
    assert sent["OutputDataConfig"]["S3OutputPath"] == (tmp_path / "out").as_uri()
    uris = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in sent["InputDataConfig"]]
    assert uris == [(tmp_path / "data" / "my train").as_uri(), "file:///abs/test"]
    assert sent["HyperParameters"] == {
        "sagemaker_submit_directory": f'"{(tmp_path / "code").as_uri()}"',
        "where": '"file://./elsewhere"'}
    assert sent["Environment"] == {"DATA": "file://./data"}
    assert params["OutputDataConfig"]["S3OutputPath"] == "file://out"  # the caller's untouched
