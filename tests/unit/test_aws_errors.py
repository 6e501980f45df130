"""botocore errors -> Shoal's error tree, and which errors the follow loop retries."""

import pytest
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from shoal.aws_errors import is_retryable, is_throttle, translate, translated
from shoal.errors import CredentialsError, PermissionError_


def client_error(code, status=400):
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "Op",
    )


@pytest.mark.parametrize(
    "code", ["ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"]
)
def test_credential_codes(code):
    assert isinstance(translate(client_error(code)), CredentialsError)


@pytest.mark.parametrize("code", ["AccessDenied", "AccessDeniedException", "403"])
def test_permission_codes(code):
    assert isinstance(translate(client_error(code, 403)), PermissionError_)


def test_no_credentials():
    error = translate(NoCredentialsError(), "CreateTrainingJob")
    assert isinstance(error, CredentialsError)
    assert "CreateTrainingJob" in str(error)


def test_other_errors_have_no_leaf():
    assert translate(client_error("ValidationException")) is None
    assert translate(ValueError("x")) is None


def test_retryable():
    assert is_throttle(client_error("ThrottlingException"))
    assert is_throttle(client_error("ThrottledException"))
    assert is_retryable(client_error("ThrottlingException"))
    assert is_retryable(client_error("InternalFailure", 500))
    assert is_retryable(client_error("Whatever", 503))
    assert is_retryable(EndpointConnectionError(endpoint_url="https://x"))
    assert is_retryable(ReadTimeoutError(endpoint_url="https://x"))
    assert not is_retryable(client_error("ValidationException"))
    assert not is_retryable(client_error("AccessDeniedException", 403))


def test_translated_reraises_mapped_and_passes_others():
    with pytest.raises(PermissionError_) as info:
        with translated("PutObject"):
            raise client_error("AccessDenied", 403)
    assert isinstance(info.value.__cause__, ClientError)
    with pytest.raises(ClientError):
        with translated():
            raise client_error("ValidationException")


def test_translated_unwraps_failed_uploads():
    with pytest.raises(CredentialsError):
        with translated("upload"):
            try:
                raise client_error("ExpiredToken")
            except ClientError:
                raise S3UploadFailedError("Failed to upload") from None
