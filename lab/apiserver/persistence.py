"""Persistence: the store's objects and revision counter, kept across restarts (optional).

A snapshot written atomically (temp + rename) plus an append-only journal of every write:
a server killed right after a write loses nothing, and a write costs one appended line
instead of a rewrite of everything. The journal is folded into a new snapshot once it
outgrows the object count, and by `close()` on stop, after which the snapshot alone is the
state (tests may edit it). Only objects and the counter survive: the store starts a loaded
state with an empty watch history, which is what an API server restart with compaction
looks like to a client. The file knows typed objects only, nothing of the store.
"""
from __future__ import annotations

import io
import json
import os


class StateFile:
    """`path` holds {"resourceVersion", "objects"}; `path.journal` one JSON line per later write."""

    COMPACT_AFTER_MIN = 1000

    def __init__(self, path: str) -> None:
        self.path = path
        self.journal_path = path + ".journal"
        self._journal: io.FileIO | None = None
        self._entries = 0

    def load(self) -> tuple[int, dict[str, dict]]:
        """The last resourceVersion and the objects by (apiVersion, kind, namespace, name) key."""
        revision = 0
        objects: dict[str, dict] = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as handle:
                snapshot = json.load(handle)
            revision = int(snapshot.get("resourceVersion") or 0)
            for obj in snapshot.get("objects") or []:
                objects[_state_key(obj)] = obj
        if os.path.exists(self.journal_path):
            with open(self.journal_path, "rb") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue  # a line cut short by a crash mid-write
                    if int(entry["rv"]) <= revision:
                        continue
                    revision = int(entry["rv"])
                    key = _state_key(entry["object"])
                    if entry["op"] == "delete":
                        objects.pop(key, None)
                    else:
                        objects[key] = entry["object"]
        return revision, objects

    def record(self, revision: int, *, deleted: bool, typed_object: dict) -> None:
        if self._journal is None:
            self._journal = open(self.journal_path, "ab", buffering=0)
        line = json.dumps(
            {"rv": revision, "op": "delete" if deleted else "put", "object": typed_object}, separators=(",", ":")
        )
        self._journal.write(line.encode() + b"\n")
        self._entries += 1

    def needs_snapshot(self, object_count: int) -> bool:
        return self._entries > max(self.COMPACT_AFTER_MIN, object_count)

    def write_snapshot(self, revision: int, typed_objects: list[dict]) -> None:
        """Atomically replace the snapshot, then empty the journal it now contains."""
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        temporary = f"{self.path}.tmp.{os.getpid()}"
        with open(temporary, "w") as handle:
            json.dump({"resourceVersion": str(revision), "objects": typed_objects}, handle, separators=(",", ":"))
        os.replace(temporary, self.path)
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if os.path.exists(self.journal_path):
            os.unlink(self.journal_path)
        self._entries = 0

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None


def _state_key(obj: dict) -> str:
    metadata = obj["metadata"]
    return f"{obj['apiVersion']}|{obj['kind']}|{metadata.get('namespace', '')}|{metadata['name']}"
