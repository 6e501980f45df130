"""The failure file: root cause first, the toolkit's lines kept, at most 1024 characters."""

from shoal.launcher import failure
from shoal.launcher.paths import JobPaths
from shoal.launcher.supervisor import Outcome, RankFailure

TRACEBACK = ("Traceback (most recent call last):", '  File "train.py", line 5, in <module>',
             '    raise ValueError("boom")', "ValueError: boom")  # fmt: skip
LONG_COMMAND = ["mpirun", "--host", "algo-1:8,algo-2:8"] + ["-x", "SM_SOMETHING"] * 200 + [
    "shoal-rank", "python", "train.py", "--password", "hunter2"]


def outcome(**kw):
    fields = dict(returncode=1, command=LONG_COMMAND,
                  failure=RankFailure(1, "algo-2", 1, None), rank_tails={1: TRACEBACK},
                  tail=("unrelated",))  # fmt: skip
    fields.update(kw)
    return Outcome(**fields)


def test_root_cause_leads_and_toolkit_lines_are_kept():
    text = failure.failure_message(outcome())
    lines = text.splitlines()
    assert lines[0] == "Rank 1 on host algo-2 exited with code 1. ValueError: boom"
    assert lines[1] == "ExecuteUserScriptError:"
    assert lines[2] == "ExitCode 1"
    assert lines[3].startswith('ErrorMessage "Traceback')
    assert "ValueError: boom\"" in text
    assert "\nCommand \"mpirun --host algo-1:8,algo-2:8" in text
    assert len(text) <= 1024
    assert "hunter2" not in text


def test_signal_and_fallback_causes():
    text = failure.failure_message(outcome(failure=RankFailure(1, "algo-1", 137, "SIGKILL"),
                                           returncode=137))  # fmt: skip
    assert text.startswith("Rank 1 on host algo-1 was killed by SIGKILL.")
    text = failure.failure_message(outcome(failure=None, returncode=2))
    assert text.startswith("Training process exited with code 2. unrelated")
    text = failure.failure_message(outcome(stopped_by="SIGTERM", failure=None, returncode=-15))
    assert text.startswith("Training stopped by SIGTERM.")


def test_huge_error_output_stays_within_limit():
    tails = {1: tuple("x" * 900 for _ in range(10))}
    text = failure.failure_message(outcome(rank_tails=tails))
    assert len(text) <= 1024
    assert text.startswith("Rank 1 on host algo-2 exited with code 1.")
    assert "ExitCode 1" in text and "Command \"" in text


def test_files(tmp_path):
    paths = JobPaths(str(tmp_path))
    failure.write_failure(paths, "first")
    failure.write_failure(paths, "second")
    assert (tmp_path / "output" / "failure").read_text() == "first"
    failure.write_success(paths)
    assert (tmp_path / "output" / "success").exists()


def test_startup_failure_message():
    text = failure.startup_failure_message(ValueError("bad"), ["pip", "install", "--token", "t"])
    assert text == 'ValueError: bad\nExitCode 1\nCommand "pip install --token ****"'


def test_headline_quotes_the_exception_when_stdout_lands_after_the_traceback():
    # stdout and stderr come through separate pipes: the script's last print can follow.
    tail = (*TRACEBACK[:2], "epoch 3 done", *TRACEBACK[2:], "saving: checkpoint 3")
    text = failure.failure_message(outcome(rank_tails={1: tail}))
    assert text.splitlines()[0] == "Rank 1 on host algo-2 exited with code 1. ValueError: boom"
