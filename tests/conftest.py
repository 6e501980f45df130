"""Suite-wide fixtures: no test may reach real AWS."""

import os

import pytest

FAKE_REGION = "us-west-2"


def _share_botocore_loader() -> None:
    """One botocore loader per test process: botocore parses its JSON models (SageMaker's
    alone is megabytes) once per Session and shares them among that Session's clients, and
    SageMaker SDK v2 makes a loader of its own for every endpoint lookup; the tests make
    hundreds of both, which parsed the same files again each time (a second and more per
    test that builds a request)."""
    import functools

    import botocore.loaders
    import botocore.session

    shared = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)
    botocore.loaders.create_loader = shared
    botocore.session.create_loader = shared


_share_botocore_loader()


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch, tmp_path_factory):
    """Clear every AWS_* variable and set fake credentials and a fake config."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key, raising=False)
    home = tmp_path_factory.mktemp("aws-home")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", FAKE_REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# More configurations of a case that `make test` runs in others (the same code paths, another
# combination of degrees, ranks or hosts): `make test-matrix` runs them, `make test` leaves them
# out to keep CI within its time. Each line names the configurations CI keeps.
MATRIX = {
    # kept: pp2-dp1 interleaved mb1 and mb8, pp4-dp1 interleaved manual, pp2-dp2 simple spread
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp2-dp1-simple-mb4-manual]",
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp4-dp1-simple-mb8-auto]",
    "tests/integration/test_modelparallel_pipeline.py::test_pipeline_matches_one_process["
    "pp2-dp2-interleaved-mb2-auto]",
    # kept: the pipeline x data checkpoint (the tensor x reduced-data one: make test-matrix)
    "tests/integration/test_modelparallel_optimizer_sharding.py::"
    "test_partial_checkpoint_resumes_bit_exact[tp2-rdp2-bf16]",
    # kept: 2 ranks on one host, 4 ranks on two simulated hosts
    "tests/integration/test_collectives_groups.py::test_groups_on_one_host[3]",
    "tests/integration/test_collectives_groups.py::test_groups_on_one_host[4]",
    # kept: 4 ranks on two simulated hosts
    "tests/integration/test_tensorflow_dataparallel.py::"
    "test_collectives_and_training_match_numpy_and_one_process[2-1]",
    # kept: the TensorFlow example on two hosts
    "tests/integration/test_examples.py::test_example_runs_locally[tensorflow-1]",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in MATRIX:
            item.add_marker(pytest.mark.matrix)
