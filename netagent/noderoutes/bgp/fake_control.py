"""`FakeBird`: the `BirdControl` seam in memory, for the agent's unit tests.

It keeps what a real BIRD would: whether it runs, the text it runs, how many times it was
reconfigured and restarted, and a session table (`sessions`: protocol name -> state, as `show
protocols all` would list it). Like the supervisor it refuses a text BIRD would refuse (here:
one that does not start with the renderer's header, or that a test marked with `refuse`), keeps
the previous text in force when it does, and reloads only when the text changed. `crash()`
kills it as `kill -9` would; `ensure_running` starts it again (counted in `restarts`).
"""
from __future__ import annotations

from netagent.noderoutes.bgp.bird_config import HEADER
from netagent.noderoutes.bgp.control import BirdControl, BirdError, BirdHealth


class FakeBird(BirdControl):
    def __init__(self) -> None:
        self.running = False
        self.text: str | None = None
        self.configures = 0          # reloads of a running BIRD (never restarts)
        self.starts = 0
        self.restarts = 0
        self.withdrawn = False       # the last stop told peers to withdraw
        self.refuse: str | None = None   # a substring that makes the next texts refused
        self.protocols_output = ""   # what show_protocols answers (captured real output in tests)

    def ensure_running(self) -> None:
        if self.running:
            return
        if self.text is None:
            raise BirdError("no BIRD configuration: apply one first")
        if self.starts:
            self.restarts += 1
        self.starts += 1
        self.running = True

    def apply_config(self, text: str) -> bool:
        if not text.startswith(HEADER) or (self.refuse is not None and self.refuse in text):
            raise BirdError("BIRD refuses the configuration: syntax error")
        if text == self.text:
            return False
        self.text = text
        if self.running:
            self.configures += 1
        return True

    def show_protocols(self) -> str:
        if not self.running:
            raise BirdError("birdc show protocols all: Unable to connect to server control socket")
        return self.protocols_output

    def health(self) -> BirdHealth:
        return BirdHealth(running=self.running, restarts=self.restarts,
                          detail="" if self.running else "bird is not running")

    def crash(self) -> None:
        self.running = False

    def stop(self, *, withdraw: bool = True) -> None:
        self.running = False
        self.withdrawn = withdraw
