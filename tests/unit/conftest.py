"""Fixtures shared by the unit tests of the lab API server."""
from __future__ import annotations

import pytest

from lab.apiserver import ApiServer


@pytest.fixture
def lab_api_servers():
    """`make(**options)` starts an in-process lab API server on 127.0.0.1 (a free port); every
    one made is stopped after the test."""
    started: list[ApiServer] = []

    def make(**options) -> ApiServer:
        api_server = ApiServer(**options)
        api_server.start()
        started.append(api_server)
        return api_server

    yield make
    for api_server in started:
        api_server.stop()


@pytest.fixture
def lab_api_server(lab_api_servers):
    """An in-process lab API server with the default options, stopped after the test."""
    return lab_api_servers()
