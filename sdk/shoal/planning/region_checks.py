"""The advisor's check that a job's input data is in the job's region, with the bucket and
subnet region look-ups it uses (from names first; AWS clients only when given)."""

from __future__ import annotations

import functools
import re

import botocore.exceptions
import botocore.session

from shoal import inputs as inputs_
from shoal.planning.findings import Finding, JobView

TIP_REGION = "Customize your training script"


@functools.lru_cache(maxsize=1)
def known_regions() -> tuple[str, ...]:
    """Every region botocore's endpoint data knows, longest first (no call is made)."""
    session = botocore.session.get_session()
    names: set[str] = set()
    for partition in session.get_available_partitions():
        names.update(session.get_available_regions("s3", partition_name=partition))
    return tuple(sorted(names, key=len, reverse=True))


def bucket_region_from_name(bucket: str) -> str | None:
    """The region an S3 bucket reference states: an access-point ARN's, or a region name
    standing as a part of the bucket's name (``data-us-west-2``), else None."""
    if bucket.startswith("arn:"):
        parts = bucket.split(":")
        return parts[3] or None if len(parts) > 3 else None
    for region in known_regions():
        if re.search(rf"(^|[-.]){re.escape(region)}($|[-.])", bucket):
            return region
    return None


def _s3_bucket(uri: str) -> str:
    rest = uri[len("s3://"):]
    if rest.startswith("arn:"):
        # s3://arn:aws:s3:region:account:accesspoint/name/key
        return "/".join(rest.split("/")[:2])
    return rest.split("/", 1)[0]


def bucket_region(bucket: str, s3_client=None) -> str | None:
    """The bucket's region from its name, else from GetBucketLocation when a client is given."""
    region = bucket_region_from_name(bucket)
    if region or s3_client is None or bucket.startswith("arn:"):
        return region
    try:
        location = s3_client.get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except botocore.exceptions.ClientError:
        return None
    # the API's legacy answers: none for us-east-1, "EU" for eu-west-1
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, location)


def subnets_region(subnets, ec2_client) -> str | None:
    """The region of the job's subnets, from their availability zones."""
    if not subnets or ec2_client is None:
        return None
    try:
        described = ec2_client.describe_subnets(SubnetIds=list(subnets))["Subnets"]
    except botocore.exceptions.ClientError:
        return None
    zones = {subnet["AvailabilityZone"] for subnet in described}
    return zones.pop()[:-1] if len(zones) == 1 else None


def check_input_regions(job: JobView, *, s3_client=None, ec2_client=None) -> list[Finding]:
    if not job.region:
        return []
    findings = []
    for name, value in job.inputs.items():
        if isinstance(value, inputs_.TrainingInput) and value.s3_data.startswith("s3://"):
            bucket = _s3_bucket(value.s3_data)
            region = bucket_region(bucket, s3_client)
            if region and region != job.region:
                findings.append(_region_finding("SHOAL-DP003", name, f"S3 bucket {bucket!r}",
                                                region, job.region))
        elif isinstance(value, inputs_.FileSystemInput):
            region = subnets_region(job.config.subnets, ec2_client)
            if region and region != job.region:
                what = f"{value.file_system_type} file system {value.file_system_id!r}"
                findings.append(_region_finding("SHOAL-DP004", name, what, region, job.region))
    return findings


def _region_finding(code: str, channel: str, what: str, region: str, job_region: str) -> Finding:
    return Finding(
        code, "error",
        f"channel {channel!r} reads {what} in {region}, but the job runs in {job_region}",
        f"copy the data to {job_region} or run the job in {region}: input data must be in "
        "the training job's region", TIP_REGION)

