"""Server-side apply: `application/apply-patch+yaml` with field ownership in `metadata.managedFields`.

`kubectl apply --server-side` sends the whole intended object and a `fieldManager`; the server
merges it into the live object and records which fields that manager now owns, so that:

- a field the manager applied before and no longer applies is removed (unless another
  manager owns it too);
- a field another manager owns with a different value is a 409 Conflict naming each field
  and its owner (kubectl prints them and suggests `--force-conflicts`); `force=true` takes
  the fields over;
- a later ordinary write (update, any patch) to an applied object records its changed
  fields under its own manager (`fieldManager`, else the User-Agent's product name) as an
  `Update` entry and takes them from the others, as the real server does.

Field sets are Kubernetes' FieldsV1 (`f:name` for a field, `k:{"port":80}` for an item of a
list merged by key, `v:"x"` for a set member, `.` for the item itself), lists merged by the
keys of `patch_meta.py` (a Service's ports by port and protocol, as there), every other
list atomic. Simplification, said plainly: objects that were never applied server-side
carry no managedFields (the real server tracks every write).
"""
from __future__ import annotations

import json
import time

from lab.apiserver.errors import ApiError, bad_request
from lab.apiserver.objects import clone
from lab.apiserver.patch_meta import KEY_DEFAULTS, PatchStrategy, key_of, strategy_for

Path = tuple[str, ...]  # FieldsV1 steps: "f:spec", "k:{...}", "v:...", "."


def _key_step(item: dict, strategy: PatchStrategy) -> str:
    return "k:" + json.dumps(key_of(item, strategy), separators=(",", ":"))


def field_values(kind: str, obj: object, path: Path = (), names: tuple[str, ...] = ()) -> dict[Path, object]:
    """Every leaf field of `obj` (a config or an object) with its value."""
    found: dict[Path, object] = {}
    if not isinstance(obj, dict) or not obj:
        found[path] = obj
        return found
    for name, value in obj.items():
        if not path and name in ("apiVersion", "kind"):
            continue
        if not path and name == "metadata":
            value = {k: v for k, v in value.items() if k in ("labels", "annotations", "finalizers",
                                                             "ownerReferences")} if isinstance(value, dict) else {}
            if not value:
                continue
        step, child_names = f"f:{name}", (*names, name)
        strategy = strategy_for(kind, child_names) if isinstance(value, list) else None
        if strategy is None:
            found.update(field_values(kind, value, (*path, step), child_names))
        elif not strategy.key:  # a set
            for member in value:
                found[(*path, step, "v:" + json.dumps(member, separators=(",", ":")))] = member
        else:
            for item in value:
                if not isinstance(item, dict) or strategy.key not in item:
                    raise bad_request(f"{'.'.join(child_names)}: every item needs its key {strategy.key!r}")
                item_path = (*path, step, _key_step(item, strategy))
                found[(*item_path, ".")] = None
                found.update(field_values(kind, item, item_path, child_names))
    return found


def to_fields_v1(paths: set[Path]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for step in path:
            node = node.setdefault(step, {})
    return tree


def from_fields_v1(tree: dict, prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for step, child in tree.items():
        if isinstance(child, dict) and child:
            paths |= from_fields_v1(child, (*prefix, step))
        else:
            paths.add((*prefix, step))
    return paths


def _readable(path: Path) -> str:
    text = ""
    for step in path:
        if step.startswith("f:"):
            text += "." + step[2:]
        elif step.startswith("k:"):
            text += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(step[2:]).items()) + "]"
        elif step.startswith("v:"):
            text += f"[{step[2:]}]"
    return text


def _entries(obj: dict) -> list[dict]:
    return list((obj.get("metadata") or {}).get("managedFields") or [])


def _owned(entry: dict) -> set[Path]:
    return from_fields_v1(entry.get("fieldsV1") or {})


def _entry(manager: str, operation: str, api_version: str, paths: set[Path]) -> dict:
    return {"manager": manager, "operation": operation, "apiVersion": api_version,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(paths)}


def _remove(obj: object, path: Path) -> None:
    """Drop the field at `path` (FieldsV1 steps) from `obj`, in place; absent: nothing."""
    node, names = obj, []
    for index, step in enumerate(path):
        last = index == len(path) - 1
        if step.startswith("f:") and isinstance(node, dict):
            if last:
                node.pop(step[2:], None)
                return
            names.append(step[2:])
            node = node.get(step[2:])
        elif step.startswith(("k:", "v:")) and isinstance(node, list):
            wanted = json.loads(step[2:])
            match = (lambda item: item == wanted) if step[0] == "v" else (
                lambda item: isinstance(item, dict)
                and all(item.get(k, KEY_DEFAULTS.get(k)) == v for k, v in wanted.items()))
            position = next((i for i, item in enumerate(node) if match(item)), None)
            if position is None:
                return
            if last:
                del node[position]
                return
            node = node[position]
        else:
            return


def merged(kind: str, live: object, config: object, names: tuple[str, ...] = ()) -> object:
    """`config` merged into `live`: objects merge, keyed lists merge by key, sets union, the rest replaced."""
    if isinstance(config, dict) and isinstance(live, dict):
        result = dict(live)
        for name, value in config.items():
            result[name] = merged(kind, live.get(name), value, (*names, name))
        return result
    strategy = strategy_for(kind, names) if isinstance(config, list) else None
    if strategy is None or not isinstance(live, list) or not isinstance(config, list):
        return config
    if not strategy.key:
        return live + [member for member in config if member not in live]
    items = list(live)
    for item in config:
        index = next((i for i, old in enumerate(items) if isinstance(old, dict)
                      and key_of(old, strategy) == key_of(item, strategy)), None)
        if index is None:
            items.append(item)
        else:
            items[index] = merged(kind, items[index], item, names)
    return items


def server_side_apply(kind: str, api_version: str, live: dict | None, config: dict, *, manager: str,
                      force: bool) -> dict:
    """The object to store after `manager` applies `config` to `live` (None: a create)."""
    applied = field_values(kind, config)
    entries = _entries(live) if live is not None else []
    live_values = field_values(kind, live) if live is not None else {}
    previous = next((_owned(e) for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"),
                    set())
    conflicts = []
    for entry in entries:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            continue
        for path in _owned(entry) & set(applied):
            if path in live_values and live_values[path] != applied[path] and path[-1] != ".":
                conflicts.append((entry.get("manager", ""), path))
    if conflicts and not force:
        causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{owner}" using {api_version}',
                   "field": _readable(path)} for owner, path in conflicts]
        listed = ("".join(f'\n- {c["message"]}: {c["field"]}' for c in causes) if len(causes) > 1
                  else f' {causes[0]["message"]}: {causes[0]["field"]}')
        raise ApiError(409, "Conflict", f"Apply failed with {len(conflicts)} conflict"
                       f"{'s' if len(conflicts) > 1 else ''}:{listed}", details={"causes": causes})
    taken = {path for _, path in conflicts}
    others: list[dict] = []
    for entry in entries:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            continue
        kept = _owned(entry) - taken
        if kept:
            others.append({**entry, "fieldsV1": to_fields_v1(kept)})
    # a copy: stored objects are shared and never changed in place
    result = clone(merged(kind, live or {}, {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}))
    assert isinstance(result, dict)
    still_owned = set().union(*(_owned(e) for e in others)) if others else set()
    unapplied = previous - set(applied) - still_owned
    for path in sorted(unapplied, key=lambda p: (p[-1] != ".", -len(p))):  # whole items first: found by key
        _remove(result, path[:-1] if path[-1] == "." else path)
    result["metadata"] = {**(result.get("metadata") or {}),
                          "managedFields": [*others, _entry(manager, "Apply", api_version, set(applied))]}
    return result


def track_update(kind: str, api_version: str, old: dict, new: dict, *, manager: str) -> list[dict] | None:
    """managedFields after an ordinary write of `new` over `old`: None when `old` carries none."""
    entries = _entries(old)
    if not entries:
        return None
    before, after = field_values(kind, old), field_values(kind, new)
    changed = {path for path, value in after.items() if before.get(path, object()) != value}
    gone = set(before) - set(after)
    if not changed and not gone:
        return entries
    result = []
    for entry in entries:
        kept = _owned(entry) - changed - gone
        if entry.get("manager") == manager and entry.get("operation") == "Update":
            changed |= kept
            continue
        if kept:
            result.append({**entry, "fieldsV1": to_fields_v1(kept)})
    if changed:
        result.append(_entry(manager, "Update", api_version, changed))
    return result
