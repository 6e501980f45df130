"""The backend protocol and the choice of backend by instance type."""

import sys
import types

import pytest
from shoal.backends import Backend, TrainingJob, backend_for, backend_name


def test_backend_name_by_instance_type():
    assert backend_name("local") == backend_name("local_gpu") == "local"
    assert backend_name("ml.p4d.24xlarge") == backend_name(None) == "sagemaker"


@pytest.mark.parametrize("attribute", ["backend", "SageMakerBackend"])
def test_backend_for_builds_the_modules_backend_with_the_session(monkeypatch, attribute):
    module = types.ModuleType("shoal.backends.sagemaker")
    setattr(module, attribute, lambda session: ("backend", session))
    monkeypatch.setitem(sys.modules, "shoal.backends.sagemaker", module)
    assert backend_for("ml.c5.xlarge", "the-session") == ("backend", "the-session")


def test_local_instance_types_get_the_local_backend():
    backend = backend_for("local", None)
    assert type(backend).__module__ == "shoal.backends.local"
    assert isinstance(backend, Backend)


def test_protocols_describe_backends_and_jobs():
    class Job:
        name = "j"
        model_data = None

        def describe(self):
            return {}

        def wait(self, logs="All"):
            return {}

        def logs(self):
            pass

        def stop(self):
            pass

    assert isinstance(Job(), TrainingJob)
    assert not isinstance(object(), Backend)
