"""Fixtures shared by the unit tests of the lab API server."""
from __future__ import annotations

import pytest

from netagent.lab.apiserver import ApiServer


@pytest.fixture
def lab_api_server():
    """An in-process lab API server on 127.0.0.1 (a free port), stopped after the test."""
    api_server = ApiServer()
    api_server.start()
    yield api_server
    api_server.stop()
