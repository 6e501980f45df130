"""What a local job says about itself: in its log and in ``fit()``'s output, one host, real
processes. Nothing it did not do (no image download, no input data), the framework version
it was asked for when this machine's differs, and the launcher's exports as a count."""

import re

import pytest
import shoal
from shoal.local import framework, state

pytestmark = [pytest.mark.slow]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_LOCAL_ROOT", str(tmp_path / "jobs"))
    monkeypatch.delenv("SM_LOG_LEVEL", raising=False)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('trained')\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("1\n")
    return tmp_path


def fit(project, name, inputs=None):
    est = shoal.PyTorch(entry_point="train.py", source_dir=str(project / "code"),
                        role="arn:aws:iam::111122223333:role/R", instance_type="local",
                        instance_count=1, framework_version="1.10.0", py_version="py38",
                        output_path=(project / "out").as_uri())
    est.fit(inputs, job_name=name)
    return (project / "jobs" / name / "logs.txt").read_text()


def test_a_job_without_inputs_says_what_it_did(project, capsys):
    log = fit(project, "quiet-job")
    printed = capsys.readouterr().out
    assert "trained" in log and log.endswith("[local] Training job completed\n")
    assert printed.endswith(log)  # fit() shows the job's log, to its last line
    assert "Downloading input data" not in log
    record = state.read(project / "jobs" / "quiet-job" / "job.json")
    assert [t["Status"] for t in record["SecondaryStatusTransitions"]][:3] == [
        "Starting", "Downloading", "Training"]  # recorded as on SageMaker, not printed
    assert "image download" not in log and "[local] Training in progress." in log
    note = framework.version_note("pytorch", "1.10.0", framework.installed_version("pytorch"))
    assert log.count(note) == 1 and printed.count(note) == 1
    exports = [line for line in log.splitlines() if "exporting" in line]
    assert len(exports) == 1
    assert re.search(r"INFO: exporting \d+ variables to the job's processes "
                     r"\(SM_LOG_LEVEL=debug names them\)$", exports[0])


def test_a_job_with_an_input_channel_names_it(project, capsys):
    log = fit(project, "fed-job", {"train": (project / "data").as_uri()})
    assert "[local] Downloading input data (channel train)" in log.splitlines()
