"""Fixtures shared by the unit tests of the TensorFlow data-parallel API."""

import importlib
import os
import uuid

import pytest


def _single_process_env(monkeypatch):
    """One process, no launcher: no rank variables, a job id of its own."""
    for key in list(os.environ):
        if key.startswith(("OMPI_", "PMI", "SHOAL_")) or key in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SHOAL_JOB_ID", uuid.uuid4().hex[:12])


@pytest.fixture
def sdp_module(monkeypatch):
    """`shoal.dataparallel.tensorflow`, not yet initialised, shut down afterwards."""
    _single_process_env(monkeypatch)
    module = importlib.import_module("shoal.dataparallel.tensorflow")
    module.shutdown()
    yield module
    module.shutdown()


@pytest.fixture
def sdp(sdp_module):
    """`shoal.dataparallel.tensorflow` initialised as a single rank."""
    sdp_module.init()
    return sdp_module
