"""`KernelError`: the kernel refused an operation. One class for both netlink seams that write
the node's links, addresses, routes and neighbours: the CNI plugin's `CniKernel`
(`cni/kernel.py`, which adds `LinkExists`) and node routing's `RoutingKernel`
(`noderoutes/routing/model.py`), their real implementations and their fakes.

What it carries is the errno (`code`), which callers branch on (EEXIST, ENETUNREACH, ENODEV,
...), and the words: `str()` is the message as the raiser wrote it. Node routing's refusals
end with the errno (`routing.model.kernel_error`), the CNI plugin's do not (they are the kernel's
own words, as the runtime shows them).
"""
from __future__ import annotations

from netagent.errors import NetagentError


class KernelError(NetagentError):
    """A kernel request failed; `code` is the errno, `str()` the message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
