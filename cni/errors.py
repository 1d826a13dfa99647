"""CNI error codes and the one exception type every layer raises.

The spec reserves codes 0-99; 100 and above are ours. Every failure that reaches the
runtime is a `CniError`, so the dispatcher has one place that turns it into the spec's
JSON error object.
"""
from __future__ import annotations

import enum
from netagent.errors import NetagentError


class ErrorCode(enum.IntEnum):
    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    CONTAINER_UNKNOWN = 3
    INVALID_ENVIRONMENT = 4
    IO_FAILURE = 5
    DECODE_FAILURE = 6
    INVALID_CONFIG = 7
    TRY_AGAIN_LATER = 11
    NOT_AVAILABLE = 50
    LIMITED_CONNECTIVITY = 51
    # netagent's own codes (100+)
    INTERNAL = 100
    CHECK_FAILED = 101
    RANGE_EXHAUSTED = 102
    ADDRESS_CONFLICT = 103
    INTERFACE_EXISTS = 104
    DELEGATE_FAILED = 105


class CniError(NetagentError):
    """A failure reported to the runtime as `{"code", "msg", "details"}`."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict:
        out = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    def __str__(self) -> str:
        return f"[{self.code}] {self.msg}" + (f": {self.details}" if self.details else "")
