"""connectivity_exec: an exec stream's output read bounded in size and time, and the agent pod
found on its node (a fake stream and a fake API: the real exec runs on the real-Kubernetes lab,
tests/kubernetes/test_connectivity.py)."""
from __future__ import annotations

import time

import pytest

from netagent.daemon import connectivity_exec as ce
from netagent.daemon import connectivity_flows as cf


class FakeStream:
    """Gives `chunks` of stdout one an update, then ends (or never, with `endless`)."""

    def __init__(self, chunks: list[str], *, endless: bool = False, code: int = 0, stderr: str = "") -> None:
        self.chunks, self.endless, self.code, self.stderr = list(chunks), endless, code, stderr
        self.open, self.closed, self.pending = True, False, ""

    def is_open(self) -> bool:
        return self.open

    def update(self, timeout: float = 0) -> None:
        if self.chunks:
            self.pending += self.chunks.pop(0)
        elif self.endless:
            time.sleep(min(timeout, 0.05))
        else:
            self.open = False

    def read_stdout(self, timeout: float = 0) -> str:
        found, self.pending = self.pending, ""
        return found

    def read_stderr(self, timeout: float = 0) -> str:
        found, self.stderr = self.stderr, ""
        return found

    @property
    def returncode(self) -> int:
        return self.code

    def close(self) -> None:
        self.closed = True


def test_the_whole_output_and_the_exit_code_of_an_ended_command():
    stream = FakeStream(['{"a": 1}\n{"b"', ': 2}\n'], code=0)
    assert ce._exec_output(stream, time.monotonic() + 5) == ('{"a": 1}\n{"b": 2}\n', "", 0)
    assert stream.closed


def test_output_past_the_limit_is_not_read_and_the_partial_line_dropped(monkeypatch):
    monkeypatch.setattr(cf, "OUTPUT_LIMIT", 12)
    stream = FakeStream(["line-1\nline", "-2\n", "line-3\n"], endless=True)
    out, _, code = ce._exec_output(stream, time.monotonic() + 5)
    assert (out, code) == ("line-1\nline-2\n", None) and stream.closed


def test_a_command_that_never_ends_is_left_at_the_deadline():
    stream = FakeStream(["one\ntw"], endless=True)
    started = time.monotonic()
    assert ce._exec_output(stream, started + 0.3) == ("one\n", "", None)
    assert time.monotonic() - started < 2 and stream.closed


class FakeApi:
    def __init__(self, pods: list[dict]) -> None:
        self.pods = pods

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        assert (namespace, selector) == (cf.AGENT_NAMESPACE, cf.AGENT_SELECTOR)
        return self.pods


def test_no_running_agent_pod_on_the_node_says_so():
    pods = [{"metadata": {"name": "netagent-x"}, "spec": {"nodeName": "node-2"}, "status": {"phase": "Running"}},
            {"metadata": {"name": "netagent-y"}, "spec": {"nodeName": "node-1"}, "status": {"phase": "Pending"}}]
    with pytest.raises(cf.FlowsUnavailable, match="no running agent pod"):
        ce.agent_flows(FakeApi(pods), "node-1", "ct")   # type: ignore[arg-type]
