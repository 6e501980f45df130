"""Fixtures the integration tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def local_s3():
    """A local S3 (and STS) server: moto's, on a free loopback port."""
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    yield f"http://{host}:{port}"
    moto.stop()
