"""OpenAPI v2 and v3 documents, generated from the official `kubernetes` client's models.

kubectl reads the OpenAPI documents for `explain`, for the patch strategies it uses when
`apply` computes a patch, and to learn that the server validates fields itself
(`fieldValidation`) and supports `dryRun`. Nothing here is written by hand: each served
kind's model class (`kinds.py`) and every class it reaches through `openapi_types` (the
field types), `attribute_map` (the JSON names) and the pydantic field info (descriptions,
required fields) become schemas named as Kubernetes names them
(`io.k8s.api.core.v1.Service`, `io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta`), the kinds
and their lists tagged with `x-kubernetes-group-version-kind`, list fields with the
`patch_meta.py` strategies. Paths carry, per resource, the operations with the query
parameters kubectl looks for.

- `/openapi/v2`: one Swagger 2.0 document, as JSON, or as gnostic's protobuf message when
  asked for it (client-go only reads it so: `openapi_proto.py`);
- `/openapi/v3`: the index of group versions; `/openapi/v3/api/v1`, `/openapi/v3/apis/G/V`:
  one OpenAPI 3.0 document per group version.

`schemas()` is also what `validation.py` checks request bodies against. Built once, lazily
(importing the models costs a second), and cached.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

from lab.apiserver.errors import ApiError
from lab.apiserver.kinds import SERVED, Kind
from lab.apiserver.openapi_proto import encode_document
from lab.apiserver.patch_meta import STRATEGIES, strategy_for
from netagent.kube.config import PatchType
from netagent.kube.resources import Resource

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
_META_TYPES = {"ObjectMeta", "ListMeta", "OwnerReference", "ManagedFieldsEntry", "LabelSelector",
               "LabelSelectorRequirement", "Condition", "Status", "StatusDetails", "StatusCause", "DeleteOptions",
               "Preconditions"}
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_SCALARS = {"str": {"type": "string"}, "int": {"type": "integer", "format": "int32"}, "bool": {"type": "boolean"},
            "float": {"type": "number", "format": "double"}, "datetime": {"type": "string", "format": "date-time"},
            "bytes": {"type": "string", "format": "byte"}}   # base64 in JSON (a ConfigMap's binaryData)
_QUERY = ("dryRun", "fieldManager", "fieldValidation", "pretty")


def _models() -> Any:
    import kubernetes.client.models as models  # a second to import: only when a document is asked for

    return models


def _short_name(class_name: str) -> str:
    return re.sub(r"^(Core|Discovery|Events|Networking)?V1(?=[A-Z])", "", class_name)


def _package(kind: Kind) -> str:
    group = kind.resource.group.split(".")[0] if kind.resource.group else "core"
    return f"io.k8s.api.{group}.{kind.resource.version}"


def _gvk(kind: Kind, suffix: str = "") -> list[dict]:
    r = kind.resource
    return [{"group": r.group, "version": r.version, "kind": r.kind + suffix}]


class _Builder:
    """Walks model classes into schemas; the first kind to reach a class names its package."""

    def __init__(self, ref_prefix: str) -> None:
        self.models = _models()
        self.ref_prefix = ref_prefix
        self.definitions: dict[str, dict] = {INT_OR_STRING: {"type": "string", "format": "int-or-string"}}
        self.names: dict[str, str] = {}

    def name_of(self, class_name: str, package: str) -> str:
        if class_name not in self.names:
            short = _short_name(class_name)
            self.names[class_name] = f"{META if short in _META_TYPES else package}.{short}"
            cls = getattr(self.models, class_name)
            self.definitions[self.names[class_name]] = {}  # reserved: recursion stops here
            self.definitions[self.names[class_name]] = self._schema(cls, package)
        return self.names[class_name]

    def _ref(self, name: str) -> dict:
        """A reference; v3 wraps it in allOf, as Kubernetes does (kubectl explain then names the type)."""
        ref = {"$ref": self.ref_prefix + name}
        return ref if self.ref_prefix.startswith("#/definitions/") else {"allOf": [ref]}

    def _type(self, text: str, attribute: str, package: str) -> dict:
        if text in _SCALARS:
            return dict(_SCALARS[text])
        if text == "object":
            return self._ref(INT_OR_STRING) if attribute.endswith("port") else {"type": "object"}
        if match := re.fullmatch(r"List\[(.+)\]", text):
            return {"type": "array", "items": self._type(match.group(1), attribute, package)}
        if match := re.fullmatch(r"Dict\[str, (.+)\]", text):
            return {"type": "object", "additionalProperties": self._type(match.group(1), attribute, package)}
        return self._ref(self.name_of(text, package))

    def _schema(self, cls: type, package: str) -> dict:
        fields = getattr(cls, "model_fields", {})
        properties, required = {}, []
        for attribute, text in cls.openapi_types.items():  # type: ignore[attr-defined]
            json_name = cls.attribute_map[attribute]  # type: ignore[attr-defined]
            schema = self._type(text, attribute, package)
            info = fields.get(attribute)
            if info is not None and info.description:
                schema["description"] = info.description
            if info is not None and info.is_required():
                required.append(json_name)
            properties[json_name] = schema
        doc = (cls.__doc__ or "").strip().split("\n\n")[0].strip()
        schema = {"type": "object", "properties": properties}
        if doc and not doc.startswith("Attributes"):
            schema["description"] = " ".join(doc.split())
        if required:
            schema["required"] = required
        return schema

    def annotate(self, root: str, kind_name: str) -> None:
        """Put the kind's list patch strategies on the schemas that hold those lists."""
        for dotted in (*STRATEGIES.get(kind_name, {}), "metadata.ownerReferences", "metadata.finalizers"):
            path = tuple(dotted.split("."))
            schema = self.definitions[root]
            for step in path[:-1]:
                schema = self._follow(schema["properties"].get(step, {}))
            prop = schema.get("properties", {}).get(path[-1])
            strategy = strategy_for(kind_name, path)
            if prop is None or strategy is None:
                continue
            prop["x-kubernetes-patch-strategy"] = strategy.extension
            prop["x-kubernetes-list-type"] = "map" if strategy.key else "set"
            if strategy.key:
                prop["x-kubernetes-patch-merge-key"] = strategy.key
                prop["x-kubernetes-list-map-keys"] = list(strategy.list_map_keys)

    def _follow(self, schema: dict) -> dict:
        while "items" in schema:
            schema = schema["items"]
        ref = schema.get("$ref") or (schema.get("allOf") or [{}])[0].get("$ref", "")
        return self.definitions.get(ref[len(self.ref_prefix):], {}) if ref else schema


def _paths(kind: Kind, name: str, ref_prefix: str, *, v3: bool) -> dict:
    r = kind.resource
    base = r.group_version_path + ("/namespaces/{namespace}" if r.namespaced else "") + f"/{r.plural}"

    def operation(verb: str, action: str, target: str, *, query: tuple[str, ...] = ()) -> dict:
        op: dict = {"operationId": f"{verb}{r.kind}", "x-kubernetes-action": action,
                    "x-kubernetes-group-version-kind": _gvk(kind)[0],
                    "parameters": [{"name": q, "in": "query", "schema" if v3 else "type":
                                    {"type": "string"} if v3 else "string", "uniqueItems": True} for q in query]}
        response = {"$ref": ref_prefix + target}
        if verb == "patch" and v3:  # kubectl reads the patch types a path takes from here
            op["requestBody"] = {"content": {t.value: {"schema": {"type": "object"}} for t in PatchType}}
        op["responses"] = {"200": {"description": "OK", **({"content": {"application/json": {"schema": response}}}
                                                          if v3 else {"schema": response})}}
        return op

    list_name = f"{name}List"
    return {
        base: {"get": operation("list", "list", list_name, query=("limit", "continue", "labelSelector")),
               "post": operation("create", "post", name, query=_QUERY)},
        base + "/{name}": {"get": operation("read", "get", name),
                           "put": operation("replace", "put", name, query=_QUERY),
                           "patch": operation("patch", "patch", name, query=(*_QUERY, "force")),
                           "delete": operation("delete", "delete", name, query=("dryRun", "gracePeriodSeconds"))},
    }


def _build(ref_prefix: str, group_version: str | None, *, v3: bool) -> tuple[dict, dict]:
    builder = _Builder(ref_prefix)
    paths: dict = {}
    for kind in sorted(SERVED, key=lambda k: (k.resource.group != "", k.resource.group)):
        model = kind.model_name
        if not hasattr(builder.models, model):
            continue
        name = builder.name_of(model, _package(kind))
        list_name = builder.name_of(model + "List", _package(kind)) if hasattr(builder.models, model + "List") \
            else None
        builder.definitions[name]["x-kubernetes-group-version-kind"] = _gvk(kind)
        if list_name is not None:
            builder.definitions[list_name]["x-kubernetes-group-version-kind"] = _gvk(kind, "List")
        builder.annotate(name, kind.resource.kind)
        if group_version is None or kind.resource.api_version == group_version:
            paths.update(_paths(kind, name, ref_prefix, v3=v3))
    return builder.definitions, paths


@functools.cache
def root_names() -> dict[Resource, str]:
    """The definition name of each served kind."""
    builder = _Builder("#/definitions/")
    return {kind.resource: builder.name_of(kind.model_name, _package(kind))
            for kind in sorted(SERVED, key=lambda k: (k.resource.group != "", k.resource.group))
            if hasattr(builder.models, kind.model_name)}


@functools.cache
def schemas() -> dict[str, dict]:
    """Every definition, by its Kubernetes name (v2 `$ref`s)."""
    return _build("#/definitions/", None, v3=False)[0]


@functools.cache
def _encoded(path: str) -> bytes:
    info = {"title": "Kubernetes", "version": "v1.37.0"}
    if path == "/openapi/v2":
        definitions, paths = _build("#/definitions/", None, v3=False)
        return json.dumps({"swagger": "2.0", "info": info, "paths": paths, "definitions": definitions}).encode()
    group_versions = sorted({k.resource.api_version for k in SERVED})
    if path == "/openapi/v3":
        index = {}
        for gv in group_versions:
            key = f"api/{gv}" if "/" not in gv else f"apis/{gv}"
            digest = hashlib.sha512(_encoded(f"/openapi/v3/{key}")).hexdigest()[:32].upper()
            index[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
        return json.dumps({"paths": index}).encode()
    for gv in group_versions:
        key = f"/openapi/v3/api/{gv}" if "/" not in gv else f"/openapi/v3/apis/{gv}"
        if path == key:
            definitions, paths = _build("#/components/schemas/", gv, v3=True)
            return json.dumps({"openapi": "3.0.0", "info": info, "paths": paths,
                               "components": {"schemas": definitions}}).encode()
    raise ApiError(404, "NotFound", f"no OpenAPI document at {path}")


OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"  # as the real server labels it


@functools.cache
def openapi_v2_protobuf() -> bytes:
    """`/openapi/v2` as client-go reads it (`openapi_proto.py`)."""
    return encode_document(json.loads(_encoded("/openapi/v2")))


def openapi_document(path: str) -> dict:
    return json.loads(_encoded(path))
