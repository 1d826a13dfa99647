"""The Kubernetes API permissions the shipped code needs, read from its source.

The ClusterRole in deploy/netagent.yaml must grant exactly these (test_deploy_manifests.py),
so the list is derived from the code rather than copied: every Python file the DaemonSet runs
(`netagent/` but the lab, `proxy/`, `cni/`) is parsed and each API call site classified:

- `Reflector(..., resource=X)`: `list` and `watch` on X (the reflector's own requests, in
  `kube/reflector.py`, are made on behalf of these and are not counted again, nor is
  `kube/config.py`, where the request functions are defined);
- `request_json(client, "VERB", path)` and `open_request(...)`: the RBAC verb of the HTTP
  method on the resource the path names. A path is `X.object_path(...)`, `X.list_path(...)`,
  either plus a constant "/subresource", or a literal or f-string API path
  (`f"/api/v1/namespaces/{ns}/events"`).

A call site this cannot classify raises `UnclassifiedCall`, so a new kind of API call fails
the test until this reader (and the ClusterRole) learn it, instead of being missed.

A Reflector given a `namespace` and a `field_selector` that starts `metadata.name=` reads one
object in one namespace: RBAC can grant that on the object alone (a Role with `resourceNames`),
so `permissions_by_scope` sets apart the permissions used only by such call sites.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from netagent.kube import resources
from netagent.kube.resources import Resource

REPO = Path(__file__).resolve().parents[3]
SHIPPED = ("netagent", "proxy", "cni")
NOT_SHIPPED = ("lab",)
# the request functions themselves, and the requests made on behalf of each Reflector(...)
MECHANISM = ("netagent/kube/config.py", "netagent/kube/reflector.py")
REQUEST_FUNCTIONS = {"request_json", "open_request"}

Permission = tuple[str, str, str]   # (API group, resource[/subresource], verb)

_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/{}]+)/[^/{}]+)(?:/namespaces/\{\})?/(?P<plural>[a-z]+)"
                   r"(?P<object>/\{\})?(?:/(?P<sub>[a-z]+))?$")
_VERBS = {("GET", True): "get", ("GET", False): "list", ("POST", False): "create", ("PATCH", True): "patch",
          ("PUT", True): "update", ("DELETE", True): "delete", ("DELETE", False): "deletecollection"}


class UnclassifiedCall(Exception):
    pass


def _resource_named(node: ast.AST) -> Resource | None:
    if isinstance(node, ast.Name):
        value = getattr(resources, node.id, None)
        return value if isinstance(value, Resource) else None
    return None


def _target(path: ast.AST) -> tuple[str, str, bool] | None:
    """(group, resource[/sub], names one object) of a path expression, or None."""
    if isinstance(path, ast.BinOp) and isinstance(path.op, ast.Add) and isinstance(path.right, ast.Constant):
        inner = _target(path.left)
        suffix = str(path.right.value)
        if inner is None or not re.fullmatch(r"/[a-z]+", suffix):
            return None
        return inner[0], inner[1] + suffix, inner[2]
    if isinstance(path, ast.Call) and isinstance(path.func, ast.Attribute):
        resource = _resource_named(path.func.value)
        if resource is not None and path.func.attr in ("object_path", "list_path"):
            return resource.group, resource.plural, path.func.attr == "object_path"
        return None
    if isinstance(path, ast.JoinedStr):
        text = "".join(str(part.value) if isinstance(part, ast.Constant) else "{}" for part in path.values)
    elif isinstance(path, ast.Constant) and isinstance(path.value, str):
        text = path.value
    else:
        return None
    match = _PATH.match(text)
    if match is None:
        return None
    plural = match["plural"] + (f"/{match['sub']}" if match["sub"] else "")
    return match["group"] or "", plural, bool(match["object"])


def _function_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _selects_one_name(given: dict[str | None, ast.expr]) -> bool:
    """A Reflector's keywords name a namespace and select one object by its name."""
    selector = given.get("field_selector")
    if "namespace" not in given or selector is None:
        return False
    parts = selector.values if isinstance(selector, ast.JoinedStr) else [selector]
    constants = [str(part.value) for part in parts if isinstance(part, ast.Constant)]
    return (bool(parts) and isinstance(parts[0], ast.Constant) and str(parts[0].value).startswith("metadata.name=")
            and not any("," in text for text in constants))


def call_sites(source: str, *, where: str) -> list[tuple[Permission, bool]]:
    """Each permission one module's API calls need, with whether that call site reads one named
    object in one namespace (a Reflector selecting `metadata.name=`)."""
    found: list[tuple[Permission, bool]] = []
    for call in (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)):
        name = _function_name(call)
        line = f"{where}:{call.lineno}"
        if name == "Reflector":
            given = {k.arg: k.value for k in call.keywords}
            resource = _resource_named(given["resource"]) if "resource" in given else None
            if resource is None:
                raise UnclassifiedCall(f"{line}: Reflector without a resource of netagent.kube.resources")
            one = _selects_one_name(given)
            found += [((resource.group, resource.plural, verb), one) for verb in ("list", "watch")]
        elif name in REQUEST_FUNCTIONS:
            if len(call.args) < 3 or not isinstance(call.args[1], ast.Constant):
                raise UnclassifiedCall(f"{line}: {name} without a literal method and a path")
            method = str(call.args[1].value)
            target = _target(call.args[2])
            if target is None or (method, target[2]) not in _VERBS:
                raise UnclassifiedCall(f"{line}: {name} {method} {ast.unparse(call.args[2])}")
            found.append(((target[0], target[1], _VERBS[(method, target[2])]), False))
    return found


def permissions_in(source: str, *, where: str) -> set[Permission]:
    """The permissions the API calls in one module's source need."""
    return {permission for permission, _ in call_sites(source, where=where)}


def shipped_modules() -> list[Path]:
    files = [p for top in SHIPPED for p in sorted((REPO / top).rglob("*.py"))]
    return [p for p in files
            if not any(p.relative_to(REPO).as_posix().startswith(prefix) for prefix in NOT_SHIPPED + MECHANISM)]


def _all_call_sites() -> list[tuple[Permission, bool]]:
    sites: list[tuple[Permission, bool]] = []
    for path in shipped_modules():
        sites += call_sites(path.read_text(), where=path.relative_to(REPO).as_posix())
    return sites


def permissions_used() -> set[Permission]:
    """Every permission the shipped code's API calls need."""
    return {permission for permission, _ in _all_call_sites()}


def permissions_by_scope() -> tuple[set[Permission], set[Permission]]:
    """(permissions some call site needs beyond one named object, permissions only call sites
    reading one named object in one namespace need)."""
    sites = _all_call_sites()
    wide = {permission for permission, one in sites if not one}
    return wide, {permission for permission, _ in sites} - wide
