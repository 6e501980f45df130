"""Shoal's one error tree. Every error Shoal raises on purpose is a ``ShoalError``;
the CLI maps the leaves to exit codes (``EXIT_CODES``).

    ShoalError
    +-- ConfigError                     the job as written cannot run (exit 2)
    |   +-- ValidationError             a value breaks an API limit or a rule
    |   |   +-- DistributionError       the ``distribution`` dict
    |   |   +-- InputError              channels, TrainingInput, FileSystemInput
    |   |   +-- SecretValueError        a secret-looking hyperparameter/env value
    |   |   +-- DebuggerError           rules, profiler and Debugger hook configuration
    |   |   +-- SourceCodeError         entry_point/source_dir name nothing (a StagingError too)
    |   +-- JobNameInUseError           a job of that name exists (local mode)
    |   +-- StagingError                source_dir, entry point, symlinks, archive
    |   +-- ImageError                  no image for that framework/version/processor
    +-- AWSError                        the AWS side refused (exit 3)
    |   +-- CredentialsError            no or invalid credentials
    |   +-- PermissionError_            AccessDenied and kin
    +-- JobError                        the job ran and did not complete (exit 1)
    |   +-- JobFailedError              status Failed (job name, FailureReason)
    |   |   +-- CapacityError           the service had no capacity
    |   +-- JobStoppedError             status Stopped
    +-- EndpointError                   an endpoint did not come into service (exit 1)
    +-- InvocationError                 an endpoint's container answered an error (exit 1)
    +-- RuntimeFailure                  inside a job: launcher and collectives (exit 1)
    |   +-- CollectiveError             a collective failed on this rank
    |   |   +-- CollectiveTimeoutError  peers did not arrive within the timeout
    |   |   +-- PeerLostError           a peer process died
    |   |   +-- ReceiveCancelledError   a receive withdrawn by Handle.cancel()
    |   +-- LaunchError                 mpirun/a rank could not start or failed
    +-- BuildError                      an image build or push failed (exit 1)
    +-- Interrupted                     Ctrl-C while following (exit 130)

Errors carry their facts as attributes (``job_name``, ``status``, ``reason``, ...)
so that callers never parse messages.
"""

from __future__ import annotations


class ShoalError(Exception):
    """The root of every error Shoal raises on purpose."""

    exit_code = 1


class ConfigError(ShoalError):
    """The job as written cannot run; nothing was sent to AWS."""

    exit_code = 2


class ValidationError(ConfigError, ValueError):
    """A value breaks an API limit or one of the platform's rules."""


class DistributionError(ValidationError):
    """The ``distribution`` dict is malformed or not supported for this job."""


class InputError(ValidationError):
    """A training input (channel) is malformed."""


class SecretValueError(ValidationError):
    """A hyperparameter or environment value looks like a secret."""


class DebuggerError(ValidationError):
    """A Debugger rule, profiler or hook configuration is malformed."""


class JobNameInUseError(ConfigError):
    """A local job of that name exists, or left its artifacts where this one would write."""

    def __init__(self, message: str, *, job_name: str):
        super().__init__(message)
        self.job_name = job_name


class StagingError(ConfigError):
    """The code cannot be staged: missing entry point, escaping symlink, ..."""


class SourceCodeError(ValidationError, StagingError):
    """``entry_point`` or ``source_dir`` names no file or directory on this machine;
    refused at ``fit()`` before any job exists (a ``StagingError`` too: the code cannot be
    staged)."""


class ImageError(ConfigError):
    """No training image exists for the requested framework/version/processor."""


class AWSError(ShoalError):
    """AWS refused a call (credentials, permissions)."""

    exit_code = 3


class CredentialsError(AWSError):
    """No credentials were found, or they are invalid or expired."""


class PermissionError_(AWSError):
    """The credentials lack a permission (AccessDenied, UnauthorizedOperation)."""


class JobError(ShoalError):
    """A training job ended without completing."""

    exit_code = 1

    def __init__(self, message: str, *, job_name: str, status: str, reason: str | None = None):
        super().__init__(message)
        self.job_name = job_name
        self.status = status
        self.reason = reason


class JobFailedError(JobError):
    """The job's status is Failed; ``reason`` holds its FailureReason."""


class CapacityError(JobFailedError):
    """The job failed because the service had no capacity for the instances."""


class JobStoppedError(JobError):
    """The job was stopped before it completed."""


class EndpointError(ShoalError):
    """An endpoint ended ``Failed`` (or another status than InService) while deploying."""

    def __init__(self, endpoint_name: str, status: str, reason: str | None = None):
        self.endpoint_name, self.status, self.reason = endpoint_name, status, reason
        super().__init__(f"Error hosting endpoint {endpoint_name}: {status}. Reason: "
                         f"{reason or 'none given'}")


class InvocationError(ShoalError):
    """An endpoint's container answered a request with an error status."""

    def __init__(self, endpoint_name: str, status: int | None, message: str):
        self.endpoint_name, self.status, self.message = endpoint_name, status, message
        super().__init__(f"{endpoint_name}: the container answered {status}: {message}")


class RuntimeFailure(ShoalError):
    """A failure inside a running job (launcher, ranks, collectives)."""


class CollectiveError(RuntimeFailure):
    """A collective operation failed on this rank."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """Peers did not reach a collective within ``SHOAL_COLLECTIVE_TIMEOUT``."""


class PeerLostError(CollectiveError):
    """A peer process died or its connection broke during a collective."""


class ReceiveCancelledError(CollectiveError):
    """A receive was withdrawn (``Handle.cancel()``) before any message matched it."""


class LaunchError(RuntimeFailure):
    """mpirun or a rank could not be started, or the training processes failed."""


class HostLostError(RuntimeFailure):
    """A host of the job stopped answering the other hosts' launchers (``SHOAL_HOST_TIMEOUT``):
    crashed, cut off the network, or frozen."""


class BuildError(ShoalError):
    """An image build or push failed."""


class Interrupted(ShoalError):
    """The user interrupted (Ctrl-C) while Shoal was following a job."""

    exit_code = 130


def exit_code_for(error: BaseException) -> int:
    """The CLI's exit code for an error: the leaf's own, 130 for KeyboardInterrupt."""
    if isinstance(error, KeyboardInterrupt):
        return 130
    if isinstance(error, ShoalError):
        return error.exit_code
    return 1
