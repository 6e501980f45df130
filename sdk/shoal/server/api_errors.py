"""The errors the endpoint answers with, in the APIs' JSON 1.1 shape: HTTP status, and a body
``{"__type": <code>, "message": ...}`` that botocore turns into ``ClientError`` with that code.

    ApiError
    +-- ValidationException (400)           a request breaks the API's model or a limit
    +-- ResourceInUse (400)                 a training job of that name exists
    +-- ResourceNotFound (400)              SageMaker: no such resource (tags of an unknown ARN)
    +-- LogsResourceNotFound (400)          Logs: ``ResourceNotFoundException``
    +-- InvalidParameterException (400)     Logs: a parameter the Logs API refuses
    +-- UnknownOperationException (400)     an X-Amz-Target this endpoint does not serve
    +-- MissingAuthenticationToken (403)    unsigned, where signatures are required
    +-- InvalidSignatureException (403)     a signature that does not verify
    +-- UnrecognizedClientException (403)   an access key this endpoint does not know
    +-- InternalFailure (500)               a bug: logged, never its traceback in the answer

Shoal's own errors (``shoal.errors``) map onto them with :func:`from_shoal_error`.
"""

from __future__ import annotations

from shoal import errors


class ApiError(Exception):
    code = "InternalFailure"
    status = 500

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def body(self) -> dict:
        return {"__type": self.code, "message": self.message}


class ValidationException(ApiError):
    code, status = "ValidationException", 400


class ResourceInUse(ApiError):
    code, status = "ResourceInUse", 400


class ResourceNotFound(ApiError):
    code, status = "ResourceNotFound", 400


class LogsResourceNotFound(ApiError):
    code, status = "ResourceNotFoundException", 400


class InvalidParameterException(ApiError):
    code, status = "InvalidParameterException", 400


class UnknownOperationException(ApiError):
    code, status = "UnknownOperationException", 400


class MissingAuthenticationToken(ApiError):
    code, status = "MissingAuthenticationTokenException", 403


class InvalidSignatureException(ApiError):
    code, status = "InvalidSignatureException", 403


class UnrecognizedClientException(ApiError):
    code, status = "UnrecognizedClientException", 403


def from_shoal_error(error: errors.ShoalError) -> ApiError:
    """A taken job name is ResourceInUse; a request the SDK's own checks refuse is the API's
    ValidationException; anything else Shoal raises on purpose while serving is a failure of
    this endpoint."""
    if isinstance(error, errors.JobNameInUseError):
        return ResourceInUse(str(error))
    if isinstance(error, errors.ConfigError):
        return ValidationException(str(error))
    return ApiError(f"{type(error).__name__}: {error}")
