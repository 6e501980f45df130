"""SigV4 verification of incoming requests, with botocore's own signer.

On loopback the endpoint ignores signatures (clients sign with whatever dummy keys they have).
Listening elsewhere it needs one access key id and its secret: each request must then carry
an ``Authorization: AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/<service>/aws4_request,
SignedHeaders=..., Signature=...`` header whose signature botocore's ``SigV4Auth`` computes
again, over the headers the client signed, from the secret; and its ``X-Amz-Date`` must be
within ``MAX_SKEW`` of this machine's clock. Nothing else runs for a request that fails.
"""

from __future__ import annotations

import datetime as dt
import hmac
import re

import attrs
from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from .api_errors import (
    InvalidSignatureException,
    MissingAuthenticationToken,
    UnrecognizedClientException,
)

MAX_SKEW = dt.timedelta(minutes=15)
SERVICES = ("sagemaker", "logs", "monitoring")  # monitoring: CloudWatch's signing name
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/,\s]+)/"
    r"(?P<service>[^/,\s]+)/aws4_request,\s*SignedHeaders=(?P<signed>[^,\s]+),\s*"
    r"Signature=(?P<signature>[0-9a-f]{64})$")


@attrs.frozen
class Verifier:
    access_key_id: str
    secret_access_key: str = attrs.field(repr=False)  # never in a log or a repr

    def verify(self, method: str, url: str, headers: dict[str, str], body: bytes,
               now: dt.datetime | None = None) -> None:
        """Raises the API's error unless the request is signed with this key."""
        lowered = {k.lower(): v for k, v in headers.items()}
        raw = lowered.get("authorization")
        if not raw:
            raise MissingAuthenticationToken("Missing Authentication Token")
        match = _AUTHORIZATION.match(raw.strip())
        if match is None:
            raise InvalidSignatureException("The Authorization header is not AWS4-HMAC-SHA256 "
                                            "with Credential, SignedHeaders and Signature")
        if not hmac.compare_digest(match["key"], self.access_key_id):
            raise UnrecognizedClientException("The security token included in the request is invalid.")
        if match["service"] not in SERVICES:
            raise InvalidSignatureException(f"Credential should be scoped to a valid service "
                                            f"({', '.join(SERVICES)}), not {match['service']!r}")
        stamp = lowered.get("x-amz-date", "")
        try:
            signed_at = dt.datetime.strptime(stamp, SIGV4_TIMESTAMP).replace(tzinfo=dt.timezone.utc)
        except ValueError:
            raise InvalidSignatureException("X-Amz-Date is missing or malformed") from None
        now = now or dt.datetime.now(dt.timezone.utc)
        if abs(now - signed_at) > MAX_SKEW or not stamp.startswith(match["date"]):
            raise InvalidSignatureException("Signature expired: X-Amz-Date is more than 15 "
                                            "minutes from this endpoint's clock")
        names = match["signed"].split(";")
        if "host" not in names or any(n not in lowered for n in names):
            raise InvalidSignatureException("SignedHeaders must include host and name only "
                                            "headers of the request")
        expected = self._signature(method, url, {n: lowered[n] for n in names}, body,
                                   match["region"], match["service"], stamp)
        if not hmac.compare_digest(expected, match["signature"]):
            raise InvalidSignatureException(
                "The request signature we calculated does not match the signature you "
                "provided. Check your AWS Secret Access Key and signing method.")

    def _signature(self, method, url, signed_headers, body, region, service, stamp) -> str:
        signer = SigV4Auth(Credentials(self.access_key_id, self.secret_access_key), service, region)
        request = AWSRequest(method=method, url=url, data=body, headers=signed_headers)
        request.context["timestamp"] = stamp
        canonical = signer.canonical_request(request)
        return signer.signature(signer.string_to_sign(request, canonical), request)
