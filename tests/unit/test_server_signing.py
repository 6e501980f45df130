"""SigV4 verification of incoming requests: requests signed by botocore with the endpoint's key
pass, for both services; a missing, foreign, stale, mis-scoped or tampered signature is
refused with the error the AWS APIs answer with; the secret never shows in a repr."""

from __future__ import annotations

import datetime as dt

import pytest
from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from shoal.server.api_errors import (
    InvalidSignatureException,
    MissingAuthenticationToken,
    UnrecognizedClientException,
)
from shoal.server.signing import Verifier

KEY, SECRET = "AKIDSHOALTEST0000001", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSHOALSECRET"
URL = "http://127.0.0.1:8080/"
BODY = b'{"MaxResults": 5}'


def signed(body: bytes = BODY, key: str = KEY, secret: str = SECRET, service: str = "sagemaker",
           target: str = "SageMaker.ListTrainingJobs") -> dict[str, str]:
    """The headers of a request botocore signed, as they arrive at the server."""
    request = AWSRequest(method="POST", url=URL, data=body,
                         headers={"X-Amz-Target": target,
                                  "Content-Type": "application/x-amz-json-1.1"})
    SigV4Auth(Credentials(key, secret), service, "us-east-1").add_auth(request)
    headers = dict(request.headers)
    headers.setdefault("Host", "127.0.0.1:8080")
    return headers


def signed_at(headers: dict[str, str]) -> dt.datetime:
    return dt.datetime.strptime(headers["X-Amz-Date"], SIGV4_TIMESTAMP).replace(tzinfo=dt.timezone.utc)


def verify(headers: dict[str, str], body: bytes = BODY, **kwargs) -> None:
    Verifier(KEY, SECRET).verify("POST", URL, headers, body, **kwargs)


def test_a_request_signed_with_the_key_passes():
    headers = signed()
    assert "host" in headers["Authorization"] and "x-amz-target" in headers["Authorization"]
    verify(headers)  # raises if refused


def test_header_names_arrive_in_any_case():
    verify({k.lower(): v for k, v in signed().items()})


def test_a_logs_request_passes():
    body = b'{"logGroupName": "/aws/sagemaker/TrainingJobs"}'
    verify(signed(body, service="logs", target="Logs_20140328.DescribeLogStreams"), body)


def test_an_empty_body_passes():
    verify(signed(b""), b"")


def test_no_authorization_is_a_missing_token():
    headers = signed()
    del headers["Authorization"]
    with pytest.raises(MissingAuthenticationToken) as caught:
        verify(headers)
    assert caught.value.status == 403 and caught.value.code == "MissingAuthenticationTokenException"


def test_an_authorization_of_another_scheme_is_refused():
    headers = signed()
    headers["Authorization"] = "Basic dXNlcjpwYXNz"
    with pytest.raises(InvalidSignatureException):
        verify(headers)


def test_another_access_key_is_unrecognized():
    with pytest.raises(UnrecognizedClientException) as caught:
        verify(signed(key="AKIDSOMEONEELSE00001"))
    assert caught.value.status == 403


def test_the_wrong_secret_is_an_invalid_signature():
    with pytest.raises(InvalidSignatureException) as caught:
        verify(signed(secret="not-the-secret"))
    assert "signature we calculated does not match" in caught.value.message


def test_a_tampered_body_is_an_invalid_signature():
    headers = signed()
    with pytest.raises(InvalidSignatureException):
        verify(headers, b'{"MaxResults": 6}')


def test_a_signed_header_changed_after_signing_is_an_invalid_signature():
    headers = signed()
    headers["X-Amz-Target"] = "SageMaker.StopTrainingJob"
    with pytest.raises(InvalidSignatureException):
        verify(headers)


def test_a_tampered_x_amz_date_is_refused():
    headers = signed()
    later = signed_at(headers) + dt.timedelta(seconds=1)
    headers["X-Amz-Date"] = later.strftime(SIGV4_TIMESTAMP)
    with pytest.raises(InvalidSignatureException):
        verify(headers, now=later)


def test_a_signature_within_fifteen_minutes_passes():
    headers = signed()
    verify(headers, now=signed_at(headers) + dt.timedelta(minutes=14))
    verify(headers, now=signed_at(headers) - dt.timedelta(minutes=14))


@pytest.mark.parametrize("shift", [dt.timedelta(minutes=16), -dt.timedelta(minutes=16)])
def test_a_signature_more_than_fifteen_minutes_away_has_expired(shift):
    headers = signed()
    with pytest.raises(InvalidSignatureException) as caught:
        verify(headers, now=signed_at(headers) + shift)
    assert "expired" in caught.value.message


def test_a_missing_x_amz_date_is_refused():
    headers = signed()
    del headers["X-Amz-Date"]
    with pytest.raises(InvalidSignatureException):
        verify(headers)


def test_a_credential_for_another_service_is_refused():
    with pytest.raises(InvalidSignatureException) as caught:
        verify(signed(service="s3"))
    assert "'s3'" in caught.value.message


def test_a_signed_header_that_is_not_sent_is_refused():
    headers = signed()
    del headers["Content-Type"]
    with pytest.raises(InvalidSignatureException):
        verify(headers)


def test_the_secret_is_never_in_the_repr():
    verifier = Verifier(KEY, SECRET)
    assert SECRET not in repr(verifier) and SECRET not in str(verifier)
    assert KEY in repr(verifier)
