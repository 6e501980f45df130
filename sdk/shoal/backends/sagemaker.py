"""The SageMaker backend: submits a ``CreateTrainingJob`` request and hands back a
:class:`SageMakerTrainingJob` that describes, follows, and stops the job.

Ctrl-C while following detaches: the job keeps running and the user is told how to
follow it again or stop it (``Interrupted``). Following never stops a job by itself.
"""

from __future__ import annotations

import logging

from shoal.aws_errors import translated
from shoal.errors import Interrupted
from shoal.follow import Follower, as_output, detach_message, normalize_log_type

logger = logging.getLogger(__name__)


def _logs_client(session):
    """The session's CloudWatch Logs client (with its retry policy) when it makes one."""
    if hasattr(session, "client"):
        return session.client("logs")
    return session.boto_session.client("logs")


class SageMakerTrainingJob:
    """A training job on SageMaker: ``name``, ``describe()``, ``wait()``, ``logs()``,
    ``stop()``, ``model_data``.

    ``follow_options`` go to :class:`~shoal.follow.Follower` (``out``, ``clock``, ``sleep``,
    ``rng``, ``backoff``): where lines are printed and how time passes.
    """

    def __init__(self, name: str, session, **follow_options):
        self.name = name
        self.job_name = name  # v2's spelling
        self.session = session
        self.follow_options = follow_options
        self._description: dict | None = None

    def __repr__(self) -> str:
        return f"SageMakerTrainingJob({self.name!r})"

    def describe(self) -> dict:
        with translated(f"DescribeTrainingJob {self.name}"):
            self._description = self.session.sagemaker_client.describe_training_job(
                TrainingJobName=self.name
            )
        return self._description

    def _follow(self, logs, wait: bool, out=None) -> dict:
        options = dict(self.follow_options)
        printer = as_output(out if out is not None else options.pop("out", None))
        options.pop("out", None)
        follower = Follower(
            self.session.sagemaker_client,
            _logs_client(self.session),
            self.name,
            logs=logs,
            out=printer,
            **options,
        )
        try:
            self._description = follower.run(wait=wait)
        except KeyboardInterrupt:
            message = detach_message(self.name, getattr(self.session, "region", None))
            printer(message)
            raise Interrupted(message) from None
        return self._description

    def wait(self, logs="All", out=None) -> dict:
        """Follow until the job ends and return its final description.

        ``Completed`` returns; ``Failed`` raises ``JobFailedError`` (``CapacityError`` when
        the service had no capacity); ``Stopped`` warns and returns, because a job stopped
        on purpose (or at its time limit) may still have saved a usable model. ``out``: a
        text stream or a line callable (default stdout).
        """
        return self._follow(normalize_log_type(logs), wait=True, out=out)

    def logs(self, wait: bool = True, out=None) -> None:
        """Print the job's status and logs, until it ends unless ``wait=False``."""
        self._follow("All", wait=wait, out=out)

    def stop(self) -> None:
        """Ask SageMaker to stop the job (StopTrainingJob)."""
        logger.info("stopping training job %s", self.name)
        with translated(f"StopTrainingJob {self.name}"):
            self.session.sagemaker_client.stop_training_job(TrainingJobName=self.name)

    @property
    def model_data(self) -> str | None:
        """``s3://.../output/model.tar.gz`` once the job produced it, else None."""
        description = self._description
        if description is None or description.get("TrainingJobStatus") not in (
            "Completed",
            "Stopped",
            "Failed",
        ):
            description = self.describe()
        return (description.get("ModelArtifacts") or {}).get("S3ModelArtifacts")


class SageMakerBackend:
    """Submits ``CreateTrainingJob`` requests with a session's SageMaker client."""

    def __init__(self, session, **follow_options):
        self.session = session
        self.follow_options = follow_options

    def submit(self, request: dict) -> SageMakerTrainingJob:
        name = request["TrainingJobName"]
        logger.info("creating training job %s", name)
        with translated(f"CreateTrainingJob {name}"):
            self.session.sagemaker_client.create_training_job(**request)
        return SageMakerTrainingJob(name, self.session, **self.follow_options)

    def job(self, name: str) -> SageMakerTrainingJob:
        """A handle on an existing job."""
        return SageMakerTrainingJob(name, self.session, **self.follow_options)


def backend(session, **follow_options) -> SageMakerBackend:
    return SageMakerBackend(session, **follow_options)
