"""Which CNI spec versions we speak, and which operations each version allows.

Kept tiny and stdlib-only: the thin client answers VERSION from here without starting
anything else.
"""
from __future__ import annotations

from cni.errors import CniError, ErrorCode

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"

# The first spec version that defines each operation.
_FIRST_VERSION = {"ADD": "0.3.0", "DEL": "0.3.0", "CHECK": "0.4.0",
                  "GC": "1.1.0", "STATUS": "1.1.0", "VERSION": "0.3.0"}


def parse(version: str) -> tuple[int, int, int]:
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise CniError(ErrorCode.INCOMPATIBLE_VERSION, f"malformed cniVersion {version!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def require_supported(version: object) -> str:
    """Return the version if we speak it, else raise code 1 naming what we do speak."""
    if not isinstance(version, str) or not version:
        raise CniError(ErrorCode.INCOMPATIBLE_VERSION, "cniVersion is missing",
                       f"supported versions: {', '.join(SUPPORTED_VERSIONS)}")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(ErrorCode.INCOMPATIBLE_VERSION, f"unsupported cniVersion {version!r}",
                       f"supported versions: {', '.join(SUPPORTED_VERSIONS)}")
    return version


def require_operation(command: str, version: str) -> None:
    first = _FIRST_VERSION[command]
    if not at_least(version, first):
        raise CniError(ErrorCode.INCOMPATIBLE_VERSION,
                       f"{command} needs cniVersion {first} or later, config says {version}")


def version_answer(requested: object) -> dict:
    """The VERSION reply, in the version the caller asked for when we speak it."""
    answer = requested if requested in SUPPORTED_VERSIONS else LATEST
    return {"cniVersion": answer, "supportedVersions": list(SUPPORTED_VERSIONS)}
