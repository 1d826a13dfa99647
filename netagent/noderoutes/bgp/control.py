"""The BIRD seam: what the agent asks of its BIRD, behind one ABC (`BirdControl`).

The agent needs four things of BIRD: that it runs (`ensure_running`), that it runs a given
configuration (`apply_config`: written atomically, reloaded only when the text changed, never
by restarting), what its protocols say (`show_protocols`: `birdc show protocols all`, parsed by
`status.py`), and that it stops (`stop`, for `netagent cleanup`). `supervisor.py`'s
`BirdSupervisor` does it with a real child process; `fake_control.py`'s `FakeBird` keeps the
same state in memory (and refuses what BIRD refuses) for the agent's unit tests.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

from netagent.errors import NetagentError


class BirdError(NetagentError, RuntimeError):
    """BIRD could not be started, reached or reconfigured; the message has BIRD's words."""


@dataclass(frozen=True)
class BirdHealth:
    running: bool
    restarts: int        # times the supervisor had to start BIRD again after it died
    detail: str = ""     # why it is not running, or the last configure error


class BirdControl(abc.ABC):
    @abc.abstractmethod
    def ensure_running(self) -> None:
        """Start BIRD with the last applied configuration if it is not running (idempotent)."""

    @abc.abstractmethod
    def apply_config(self, text: str) -> bool:
        """Make BIRD run `text`; True when it changed (the file is rewritten and BIRD reloads it
        with `configure`), False when BIRD already runs exactly this text. `BirdError` when BIRD
        refuses it: the previous configuration stays in force."""

    @abc.abstractmethod
    def show_protocols(self) -> str:
        """`show protocols all` as BIRD's control socket answers it."""

    @abc.abstractmethod
    def health(self) -> BirdHealth: ...

    @abc.abstractmethod
    def stop(self, *, withdraw: bool = True) -> None:
        """Stop BIRD and stop restarting it; the kernel routes it exported stay (`persist`).
        `withdraw`: tell the peers to withdraw our routes (cleanup); otherwise they hold them for
        the graceful restart time (an agent restart)."""
