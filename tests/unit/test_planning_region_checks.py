"""The advisor's check that input data is in the job's region, and its region look-ups."""

import boto3
import pytest
from botocore.stub import Stubber
from shoal.inputs import FileSystemInput
from shoal.planning import advisor, region_checks

from tests.unit.test_planning_advisor import REGION, codes, only, pytorch


@pytest.mark.parametrize("bucket, region", [
    ("data-eu-west-1", "eu-west-1"),
    ("sagemaker-us-west-2-123456789012", "us-west-2"),
    ("my.bucket.ap-southeast-2.archive", "ap-southeast-2"),
    ("arn:aws:s3:eu-central-1:123456789012:accesspoint/train", "eu-central-1"),
    ("training-data", None),
    ("bus-west-20", None),
])
def test_bucket_region_from_its_name(bucket, region):
    assert region_checks.bucket_region_from_name(bucket) == region


def test_s3_input_in_another_region_is_an_error():
    findings = advisor.advise(pytorch(), {"train": "s3://data-eu-west-1/train",
                                          "test": "s3://data-us-west-2/test"})
    finding = only(findings, "SHOAL-DP003")
    assert finding.severity == "error"
    assert finding.message == ("channel 'train' reads S3 bucket 'data-eu-west-1' in eu-west-1, "
                               "but the job runs in us-west-2")


def test_access_point_arn_region():
    uri = "s3://arn:aws:s3:eu-central-1:123456789012:accesspoint/train/prefix/"
    finding = only(advisor.advise(pytorch(), uri), "SHOAL-DP003")
    assert "eu-central-1" in finding.message


def test_bucket_region_through_get_bucket_location():
    s3 = boto3.client("s3", region_name=REGION)
    with Stubber(s3) as stub:
        stub.add_response("get_bucket_location", {"LocationConstraint": "EU"},
                          {"Bucket": "training-data"})
        findings = advisor.advise(pytorch(), "s3://training-data/x", s3_client=s3)
    assert "in eu-west-1" in only(findings, "SHOAL-DP003").message
    with Stubber(s3) as stub:
        stub.add_response("get_bucket_location", {}, {"Bucket": "training-data"})
        assert region_checks.bucket_region("training-data", s3) == "us-east-1"
    with Stubber(s3) as stub:
        stub.add_client_error("get_bucket_location", "AccessDenied")
        assert region_checks.bucket_region("training-data", s3) is None


def test_no_region_known_means_no_region_check():
    est = pytorch(instance_type="local", distribution=None, instance_count=1)
    assert advisor.advise(est, "s3://data-eu-west-1/train") == []


def test_file_system_in_the_subnets_other_region():
    fsx = FileSystemInput("fs-0123456789abcdef0", "FSxLustre", "/fsx/train")
    est = pytorch(subnets=["subnet-0abc"], security_group_ids=["sg-0abc"])
    ec2 = boto3.client("ec2", region_name=REGION)
    with Stubber(ec2) as stub:
        stub.add_response("describe_subnets",
                          {"Subnets": [{"SubnetId": "subnet-0abc", "AvailabilityZone": "eu-west-1a"}]},
                          {"SubnetIds": ["subnet-0abc"]})
        finding = only(advisor.advise(est, {"train": fsx}, ec2_client=ec2), "SHOAL-DP004")
    assert finding.severity == "error"
    assert "FSxLustre file system 'fs-0123456789abcdef0' in eu-west-1" in finding.message
    # without a way to know the subnets' region, file systems are not judged
    assert "SHOAL-DP004" not in codes(advisor.advise(est, {"train": fsx}))
