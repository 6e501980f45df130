"""How botocore's errors map onto Shoal's error tree, and which ones are worth a retry.

Every AWS call Shoal makes goes through :func:`translated` at the edge, so callers see
``CredentialsError`` / ``PermissionError_`` instead of botocore's exceptions, and the
follow loop asks :func:`is_retryable` whether to back off instead of crashing.
"""

from __future__ import annotations

import contextlib

from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import (
    ClientError,
    ConnectionError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from shoal.errors import AWSError, CredentialsError, PermissionError_

CREDENTIAL_CODES = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "RequestExpired",
    }
)
THROTTLE_CODES = frozenset(
    {
        "ThrottlingException",
        "ThrottledException",
        "Throttling",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "SlowDown",
        "ProvisionedThroughputExceededException",
    }
)
TRANSIENT_CODES = frozenset(
    {"InternalFailure", "InternalError", "InternalServerError", "ServiceUnavailable"}
)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ``ClientError`` ("" for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _status(exc: BaseException) -> int:
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def is_throttle(exc: BaseException) -> bool:
    return error_code(exc) in THROTTLE_CODES


def is_retryable(exc: BaseException) -> bool:
    """Throttling, 5xx and connection trouble: back off and try again."""
    if isinstance(exc, (ConnectionError, EndpointConnectionError, ReadTimeoutError)):
        return True
    return is_throttle(exc) or error_code(exc) in TRANSIENT_CODES or _status(exc) >= 500


def translate(exc: BaseException, action: str = "") -> AWSError | None:
    """The Shoal error for a botocore error, or None when it has no leaf of its own."""
    where = f" ({action})" if action else ""
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return CredentialsError(f"no usable AWS credentials{where}: {exc}")
    code = error_code(exc)
    if code in CREDENTIAL_CODES:
        return CredentialsError(f"AWS credentials rejected{where}: {code}: {exc}")
    # HEAD requests carry no error body: S3 answers a bare "403".
    if code.startswith("AccessDenied") or code in {"UnauthorizedOperation", "Forbidden", "403"}:
        return PermissionError_(f"permission denied{where}: {exc}")
    return None


@contextlib.contextmanager
def translated(action: str = ""):
    """Re-raise botocore errors as Shoal's; others pass through unchanged."""
    try:
        yield
    except (ClientError, NoCredentialsError, PartialCredentialsError) as exc:
        mapped = translate(exc, action)
        if mapped is None:
            raise
        raise mapped from exc
    except S3UploadFailedError as exc:
        # boto3 wraps the ClientError of a failed upload; the cause is its context.
        mapped = translate(exc.__context__, action) if exc.__context__ else None
        if mapped is None:
            raise
        raise mapped from exc
