"""What a request addresses: the API path parsed into resource, namespace, name, subresource.

Paths are the real server's: `/api/v1/...` for the core group, `/apis/GROUP/VERSION/...`
otherwise, an optional `watch/` segment (the old watch paths), `namespaces/NS/` before a
namespaced resource, then the resource, the name, and `status` for the resources that have
that subresource. `parse_target` answers None for anything else, which the handler then
tries as a discovery path before answering 404. The query helpers read the parameters the
way the real server does (`gracePeriodSeconds` also from a DeleteOptions body;
`check_list_options`: the ListOptions rules of a list or watch). No state:
the handler calls these and hands the results to the store.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from lab.apiserver.errors import bad_request, invalid_list_options
from lab.apiserver.kinds import RESOURCES
from lab.apiserver.objects import STATUS_SUBRESOURCE, Subresource
from lab.apiserver.selectors import integer
from netagent.kube.resources import Resource

_BY_GROUP_VERSION_PLURAL = {(r.group, r.version, r.plural): r for r in RESOURCES}


@dataclass(frozen=True)
class Target:
    resource: Resource
    namespace: str | None
    name: str | None
    part: Subresource
    watch_path: bool


def parse_target(path: str) -> Target | None:
    segments = [unquote(s) for s in path.strip("/").split("/")]
    if len(segments) >= 2 and segments[0] == "api":
        group, version, rest = "", segments[1], segments[2:]
    elif len(segments) >= 3 and segments[0] == "apis":
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        return None
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] != "status":
        namespace, rest = rest[1], rest[2:]
    if not 1 <= len(rest) <= 3:
        return None
    resource = _BY_GROUP_VERSION_PLURAL.get((group, version, rest[0]))
    if resource is None or (namespace is not None and not resource.namespaced):
        return None
    name = rest[1] if len(rest) >= 2 else None
    if name is not None and resource.namespaced and namespace is None:
        return None
    part = Subresource.MAIN
    if len(rest) == 3:
        if rest[2] != "status" or resource not in STATUS_SUBRESOURCE:
            return None
        part = Subresource.STATUS
    return Target(resource, namespace, name, part, watch_path)


def grace_period(query: dict[str, str], body: object) -> int | None:
    """`gracePeriodSeconds` from the query or a DeleteOptions body; None when not given."""
    given = query.get("gracePeriodSeconds")
    if given is None and isinstance(body, dict):
        given = body.get("gracePeriodSeconds")
    if given is None or given == "":
        return None
    value = integer(str(given))
    if value is None or value < 0:
        raise bad_request(f"gracePeriodSeconds {given!r}: expected a whole number of seconds >= 0")
    return value


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def check_list_options(query: dict[str, str], *, watch: bool) -> None:
    """The real server's ListOptions rules for `resourceVersionMatch` and `sendInitialEvents`
    (apimachinery's ValidateListOptions), all errors at once: 422 Invalid."""
    match = query.get("resourceVersionMatch") or ""
    initial = "sendInitialEvents" in query  # given at all, as Go's pointer: "false" counts
    errors = []
    if watch:
        if initial and match != "NotOlderThan":
            errors.append("resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch "
                          "to NotOlderThan")
        if match:
            if not initial:
                errors.append("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless "
                              "sendInitialEvents is provided")
            if match != "NotOlderThan":
                errors.append(f'resourceVersionMatch: Unsupported value: "{match}": supported values: "NotOlderThan"')
    else:
        if match:
            if not query.get("resourceVersion"):
                errors.append("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                              "resourceVersion is provided")
            if query.get("continue"):
                errors.append("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is "
                              "provided")
            if match == "Exact" and query.get("resourceVersion") == "0":  # (sic: the real message's lower case)
                errors.append('resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
                              'resourceVersion "0"')
            elif match not in ("Exact", "NotOlderThan"):
                errors.append(f'resourceVersionMatch: Unsupported value: "{match}": supported values: "Exact", '
                              '"NotOlderThan", ""')
        if initial:
            errors.append("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list")
    if errors:
        raise invalid_list_options(errors)
