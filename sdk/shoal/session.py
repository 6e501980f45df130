"""``shoal.Session``: the AWS side of an estimator. It owns the clients (injectable, for
tests and for callers with their own), the region, the account (asked of STS once, when
first needed), the default bucket's name and the retry policy of every client it makes.
"""

from __future__ import annotations

import os

import boto3
import botocore.config

from shoal import naming
from shoal.errors import ValidationError

DEFAULT_MAX_ATTEMPTS = 10
# Local mode needs no AWS: a region is only reported to the script (SM_* / sagemaker_region).
LOCAL_REGION = "us-east-1"


def _configured_region() -> str | None:
    return boto3.Session().region_name


def _user_configured_retries(boto_session: boto3.Session) -> bool:
    """True when the user set a retry mode or attempt count (environment or config file)."""
    if os.environ.get("AWS_RETRY_MODE") or os.environ.get("AWS_MAX_ATTEMPTS"):
        return True
    scoped = boto_session._session.get_scoped_config()
    return "retry_mode" in scoped or "max_attempts" in scoped


def retry_config(boto_session: boto3.Session,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> botocore.config.Config | None:
    """botocore's ``standard`` retry mode, unless the user configured retries already."""
    if _user_configured_retries(boto_session):
        return None
    return botocore.config.Config(retries={"mode": "standard", "max_attempts": max_attempts})


class Session:
    """The clients and account facts an estimator needs.

    ``Session(boto_session=boto3.Session(region_name="us-west-2"))``; any client may be
    passed in (``sagemaker_client=``, ``s3_client=``, ``sts_client=``, ``iam_client=``),
    otherwise it is made from ``boto_session`` with :func:`retry_config`. ``default_bucket``
    overrides the ``sagemaker-{region}-{account}`` bucket. ``local_mode=True`` (what
    ``instance_type="local"`` uses) works without any AWS configuration. ``backend="slurm"``
    (or ``SHOAL_BACKEND=slurm``) sends jobs of non-local instance types to a Slurm cluster,
    configured by ``slurm=`` (``shoal.slurm.settings.SlurmSettings`` or a mapping).
    """

    def __init__(self, boto_session: boto3.Session | None = None, sagemaker_client=None,
                 s3_client=None, sts_client=None, iam_client=None,
                 default_bucket: str | None = None, default_bucket_prefix: str | None = None,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, local_mode: bool = False,
                 backend: str | None = None, slurm=None):
        from shoal.backends import chosen_backend

        self.backend = chosen_backend(None, {"SHOAL_BACKEND": backend} if backend else os.environ)
        # a Slurm cluster needs no AWS either (its data and output are on its filesystem)
        local_mode = local_mode or self.backend == "slurm"
        self.local_mode = local_mode
        self._slurm = slurm
        self.boto_session = boto_session or boto3.Session(
            region_name=LOCAL_REGION if local_mode and not _configured_region() else None)
        if not self.boto_session.region_name:
            raise ValidationError(
                "no AWS region: pass boto_session=boto3.Session(region_name=...) or set "
                "AWS_DEFAULT_REGION")
        self._config = retry_config(self.boto_session, max_attempts)
        self._clients = {"sagemaker": sagemaker_client, "s3": s3_client, "sts": sts_client,
                         "iam": iam_client}
        self._default_bucket = default_bucket
        self.default_bucket_prefix = default_bucket_prefix
        self._account: str | None = None

    def slurm_settings(self):
        """The Slurm cluster's settings (``slurm=``: SlurmSettings or the config file's
        mapping; else from the environment)."""
        from shoal.slurm.settings import SlurmSettings

        if not isinstance(self._slurm, SlurmSettings):
            self._slurm = SlurmSettings.resolve(self._slurm)
        return self._slurm

    @property
    def region(self) -> str:
        return self.boto_session.region_name

    # v2's spelling
    boto_region_name = region

    def client(self, service: str):
        """The session's client for a service, made once."""
        if self._clients.get(service) is None:
            self._clients[service] = self.boto_session.client(
                service, region_name=self.region, config=self._config)
        return self._clients[service]

    @property
    def sagemaker_client(self):
        return self.client("sagemaker")

    @property
    def s3_client(self):
        return self.client("s3")

    def account_id(self) -> str:
        """The caller's account (STS GetCallerIdentity, asked once)."""
        if self._account is None:
            self._account = self.client("sts").get_caller_identity()["Account"]
        return self._account

    def default_bucket(self) -> str:
        """The bucket's name; staging creates it (with the owner check) when it is used."""
        if self._default_bucket is None:
            self._default_bucket = naming.default_bucket_name(self.region, self.account_id())
        return self._default_bucket

    def is_default_bucket(self, bucket: str) -> bool:
        return bucket == self.default_bucket()

    def expand_role(self, role: str) -> str:
        """A role ARN as is; a bare role name through IAM GetRole."""
        if "/" in role or role.startswith("arn:"):
            return role
        return self.client("iam").get_role(RoleName=role)["Role"]["Arn"]
