"""Following a SageMaker training job: status transitions, logs, and the outcome.

:class:`Follower` polls DescribeTrainingJob with backoff and jitter, prints each new
secondary status transition, tails every host's CloudWatch log stream through a
:class:`~shoal.logs.LogTailer`, says so when no log event arrived for a while, and at the
end prints the training and billable seconds (and the spot savings) as the SageMaker
Python SDK v2 does, then the job's final metrics and each rule's findings
(:func:`closing_lines`; the local backend prints the same). Then it judges the
outcome: ``Completed`` returns, ``Failed`` raises ``JobFailedError`` (``CapacityError``
when the service lacked capacity), ``Stopped`` warns and returns.

The clock, the sleep and the random source are injectable so that tests run the whole
loop without waiting.
"""

from __future__ import annotations

import logging
import random
import re
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone

import attrs
from rich.console import Console
from rich.text import Text

from shoal.aws_errors import is_retryable, translated
from shoal.errors import CapacityError, JobFailedError, ValidationError
from shoal.handles import sagemaker_handle
from shoal.logs import LogTailer, format_event

logger = logging.getLogger(__name__)

TERMINAL = ("Completed", "Failed", "Stopped")
LOG_TYPES = ("All", "None", "Training", "Rules")
IDLE_NOTICE_S = 30.0


def normalize_log_type(logs) -> str:
    """v2's ``logs`` argument: one of LOG_TYPES, or a bool (True = All, False = None)."""
    if logs is True:
        return "All"
    if logs is False or logs is None:
        return "None"
    if logs not in LOG_TYPES:
        raise ValidationError(f"'logs' must be in {LOG_TYPES} or a bool (got {logs!r})")
    return logs


@attrs.frozen
class Backoff:
    """Poll delays: from ``start`` growing by ``factor`` up to ``cap``, with +-``jitter``."""

    start: float = 5.0
    cap: float = 30.0
    factor: float = 1.5
    jitter: float = 0.2

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.cap, self.start * self.factor ** max(0, attempt))
        return base * (1 + rng.uniform(-self.jitter, self.jitter))


def transition_line(transition: dict) -> str:
    """``2024-01-01 12:00:00 Starting - Preparing the instances for training``."""
    start = transition.get("StartTime")
    if isinstance(start, datetime):
        if start.tzinfo is not None:
            start = start.astimezone(timezone.utc)
        when = start.strftime("%Y-%m-%d %H:%M:%S")
    else:
        when = "????-??-?? ??:??:??"
    return f"{when} {transition.get('Status', '')} - {transition.get('StatusMessage', '')}"


def instance_count(description: dict) -> int:
    config = description.get("ResourceConfig", {})
    if config.get("InstanceGroups"):
        return sum(g["InstanceCount"] for g in config["InstanceGroups"])
    return int(config.get("InstanceCount", 1))


def billing_lines(description: dict) -> list[str]:
    """Training and billable seconds (times the instance count) and spot savings."""
    count = instance_count(description)
    training = description.get("TrainingTimeInSeconds")
    billable = description.get("BillableTimeInSeconds")
    lines = []
    if training is not None:
        lines.append(f"Training seconds: {training * count}")
    if billable is not None:
        lines.append(f"Billable seconds: {billable * count}")
        if description.get("EnableManagedSpotTraining") and training:
            saving = (1 - float(billable) / training) * 100
            lines.append(f"Managed Spot Training savings: {saving:.1f}%")
    return lines


def check_outcome(description: dict) -> dict:
    """Raise for a Failed job, warn for a Stopped one, return the description otherwise."""
    name = description.get("TrainingJobName", "")
    status = description["TrainingJobStatus"]
    if status == "Stopped":
        message = (
            f"training job {name} ended with status Stopped rather than Completed: it was "
            "stopped or hit its time limit; check that its output is what you expect"
        )
        warnings.warn(message, stacklevel=3)
        logger.warning(message)
    elif status != "Completed":
        reason = description.get("FailureReason", "(no reason given)")
        cls = CapacityError if "CapacityError" in str(reason) else JobFailedError
        raise cls(
            f"training job {name} {status}: {reason}",
            job_name=name,
            status=status,
            reason=reason,
        )
    return description


def _rule_lines(description: dict, last: dict) -> list[str]:
    """Debugger/Profiler rule statuses that changed since the last look."""
    lines = []
    for key in ("DebugRuleEvaluationStatuses", "ProfilerRuleEvaluationStatuses"):
        for rule in description.get(key) or []:
            name, status = rule.get("RuleConfigurationName"), rule.get("RuleEvaluationStatus")
            if last.get((key, name)) != status:
                last[(key, name)] = status
                lines.append(f"{name}: {status}")
    return lines


def _metric_time(value) -> str:
    """A FinalMetricDataList timestamp (a datetime, epoch seconds or ISO text) as UTC HH:MM:SS."""
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, timezone.utc)
    elif isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
    if not isinstance(value, datetime):
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%H:%M:%S")


def metrics_line(description: dict) -> str | None:
    """``Final metrics: loss=0.0312 (at 12:01:33), ...``; None when the job has none."""
    parts = []
    for metric in description.get("FinalMetricDataList") or []:
        name, value = metric.get("MetricName"), metric.get("Value")
        if name is None or value is None:
            continue
        when = _metric_time(metric.get("Timestamp"))
        parts.append(f"{name}={float(value):g}" + (f" (at {when})" if when else ""))
    return f"Final metrics: {', '.join(parts)}" if parts else None


# Shoal's StatusDetails: one "<Rule>: <finding> (triggered N time(s)). Fix: <text>" per line
_FINDING = re.compile(r"^(?P<rule>[A-Za-z0-9_.-]+): (?P<finding>.*\(triggered \d+ time\(s\)\))\.?"
                      r"(?: Fix: (?P<fix>.*))?$")


def _known_fix(*names: str) -> str:
    """A built-in profiler rule's recommendation, by rule or configuration name."""
    try:
        from shoal.profiler.rules import RULES, SHOAL_RULES
    except Exception:  # the rules' own dependencies missing: no fix to add
        return ""
    known = {**RULES, **SHOAL_RULES}
    for name in names:
        if name in known and known[name].recommendation:
            return known[name].recommendation
    return ""


def finding_lines(description: dict) -> list[str]:
    """One line per finding of every rule whose evaluation found issues (or failed): the
    rule, what it found and how often, and the fix. Shoal's rules write their findings into
    StatusDetails one per line; any other text (SageMaker's own) is shown as it is."""
    lines = []
    for key in ("DebugRuleEvaluationStatuses", "ProfilerRuleEvaluationStatuses"):
        for rule in description.get(key) or []:
            config, status = rule.get("RuleConfigurationName", "?"), rule.get("RuleEvaluationStatus")
            details = (rule.get("StatusDetails") or "").strip()
            if status == "Error":
                lines.append(f"  {config}: evaluation failed: {details or '(no reason given)'}")
                continue
            if status != "IssuesFound":
                continue
            for text in details.splitlines() or [""]:
                match = _FINDING.match(text.strip())
                if match:
                    name = match["rule"]
                    label = config if name == config else f"{config}/{name}"
                    finding, fix = match["finding"], match["fix"] or _known_fix(name, config)
                else:
                    label, finding, fix = config, text.strip() or "issues found", _known_fix(config)
                lines.append(f"  {label}: {finding}" + (f" -- fix: {fix}" if fix else ""))
    return lines


def closing_lines(description: dict) -> list[str]:
    """What a finished job leaves to read: its final metrics and its rules' findings, with
    no header for what it does not have."""
    lines = []
    metrics = metrics_line(description)
    if metrics:
        lines.append(metrics)
    findings = finding_lines(description)
    if findings:
        lines.append("Rule findings:")
        lines += findings
    return lines


_HOST_PREFIX = re.compile(r"^\[algo-(\d+)\] ")
HOST_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


class ConsoleOutput:
    """Prints lines to stdout. On a terminal or in a notebook each host's ``[algo-N]``
    prefix gets its own colour; the line itself is never read as markup."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False, markup=False, emoji=False)
        self.color = bool(self.console.is_terminal or self.console.is_jupyter)

    def __call__(self, text: str) -> None:
        if not self.color:
            self.console.file.write(text + "\n")
            self.console.file.flush()
            return
        match = _HOST_PREFIX.match(text)
        line = Text(text)
        if match:
            style = HOST_STYLES[(int(match.group(1)) - 1) % len(HOST_STYLES)]
            line = Text.assemble((match.group(0), style), text[match.end():])
        self.console.print(line, soft_wrap=True)


def as_output(out) -> Callable[[str], None]:
    """``out`` as a line printer: None is stdout, a text stream is written to (coloured
    when it is a terminal), a callable is used as is."""
    if out is None:
        return ConsoleOutput()
    if hasattr(out, "write"):
        return ConsoleOutput(Console(file=out, highlight=False, markup=False, emoji=False))
    return out


class Follower:
    """Follows one job until it ends (``run``) or reads what is there (``run(wait=False)``)."""

    def __init__(
        self,
        sagemaker_client,
        logs_client,
        job_name: str,
        *,
        logs="All",
        out=None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        backoff: Backoff = Backoff(),
        idle_notice: float = IDLE_NOTICE_S,
    ):
        self.sm = sagemaker_client
        self.logs_client = logs_client
        self.job_name = job_name
        self.log_type = normalize_log_type(logs)
        self.out = as_output(out)
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.backoff = backoff
        self.idle_notice = idle_notice
        self.tailer: LogTailer | None = None
        self._printed: set[tuple[int, str]] = set()
        self._rules: dict = {}
        self._attempt = 0
        self._last_event = 0.0
        self._idle_noted = 0.0

    # -- one step each ---------------------------------------------------------------
    def describe(self) -> dict | None:
        """DescribeTrainingJob; None (and a note) when throttled or the network hiccups."""
        try:
            with translated(f"DescribeTrainingJob {self.job_name}"):
                return self.sm.describe_training_job(TrainingJobName=self.job_name)
        except Exception as exc:
            if not is_retryable(exc):
                raise
            self._note_retry("DescribeTrainingJob", exc)
            return None

    def _note_retry(self, what: str, exc: BaseException) -> None:
        logger.info("%s: %s; backing off", what, exc)
        self.out(f"({what} {type(exc).__name__}: {_short(exc)}; retrying)")
        self._attempt += 2  # back off harder than for a quiet job

    def show_status(self, description: dict) -> bool:
        """Print new status transitions (and rule statuses); True when there were any."""
        fresh = False
        for i, t in enumerate(description.get("SecondaryStatusTransitions") or []):
            key = (i, t.get("StatusMessage", ""))
            if key not in self._printed:
                self._printed.add(key)
                self.out(transition_line(t))
                fresh = True
        if self.log_type in ("All", "Rules"):
            for line in _rule_lines(description, self._rules):
                self.out(line)
        return fresh

    def show_logs(self) -> None:
        """Print new log lines; any line resets the idle clock and the backoff."""
        if self.tailer is None:
            return
        events = self.tailer.poll()
        if self.tailer.last_error is not None:
            self._note_retry("CloudWatch Logs", self.tailer.last_error)
        for event in events:
            self.out(format_event(event))
        if events:
            self._last_event, self._idle_noted, self._attempt = self.clock(), 0.0, 0

    def pause(self, description: dict) -> None:
        """Sleep until the next poll, saying so first when the logs have gone quiet."""
        delay = self.backoff.delay(self._attempt, self.rng)
        if self.tailer is not None:
            idle = self.clock() - self._last_event
            notice_at = max(self.idle_notice, 2 * self._idle_noted)  # 30 s, then sparser
            if idle >= notice_at:
                self._idle_noted = idle
                self.out(self._idle_line(idle, description))
            else:  # wake up in time to say so, rather than overshoot
                delay = min(delay, max(0.5, notice_at - idle))
        self.sleep(delay)
        self._attempt += 1

    # -- the loop --------------------------------------------------------------------
    def run(self, wait: bool = True) -> dict:
        """Follow until the job ends (``wait``) or print what is there now; judge the end."""
        description = self.describe()
        while description is None:
            self.sleep(self.backoff.delay(self._attempt, self.rng))
            description = self.describe()
        self.show_status(description)
        if self.log_type in ("All", "Training"):
            self.tailer = LogTailer(
                self.logs_client, self.job_name, instance_count=instance_count(description)
            )
        finished = description["TrainingJobStatus"] in TERMINAL or not wait
        self._last_event, self._idle_noted = self.clock(), 0.0
        while True:
            self.show_logs()
            if finished:
                break
            self.pause(description)
            fresh = self.describe()
            if fresh is None:
                continue
            description = fresh
            if self.show_status(description):
                self._attempt = 0  # things are moving: look again soon
            if description["TrainingJobStatus"] in TERMINAL:
                # One more pause and read: events reach CloudWatch after the status flips.
                self.sleep(self.backoff.start)
                finished = True
        if wait:
            for line in billing_lines(description) + closing_lines(description):
                self.out(line)
            check_outcome(description)
        return description

    def _idle_line(self, idle: float, description: dict) -> str:
        status = description.get("TrainingJobStatus", "?")
        secondary = description.get("SecondaryStatus", "?")
        return f"no log events for {idle:.0f} s; job status {status}/{secondary}"


def detach_message(job_name: str, region: str | None) -> str:
    """What to tell the user who pressed Ctrl-C: the job goes on; how to follow or stop it."""
    handle = str(sagemaker_handle(region, job_name)) if region else job_name
    return (
        f"Stopped following training job {job_name}; the job keeps running.\n"
        f"  follow it again:  shoal.attach({job_name!r}).logs()   or   shoal logs {handle}\n"
        f"  stop it:          shoal.attach({job_name!r}).stop()   or   shoal stop {handle}"
    )


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 120 else text[:117] + "..."
