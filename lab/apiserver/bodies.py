"""What a request's headers and query ask for: the body's media type, the answer's, dry run.

Bodies: JSON (`application/json` and the three JSON patch types) and YAML
(`application/yaml`, which the real server also takes, and `application/apply-patch+yaml`,
server-side apply's) are decoded here. Protobuf
(`application/vnd.kubernetes.protobuf`, which kubectl's typed commands send: `create
namespace`, `create service`) is decoded by `protobuf.py` for the kinds it knows and refused
415 otherwise. Answers are JSON; an `Accept` naming `as=Table` (kubectl get) gets a
meta.k8s.io/v1 Table. `dryRun=All` is the only dry-run value, as on the real server.
"""
from __future__ import annotations

import json

import yaml

from lab.apiserver.errors import ApiError, bad_request
from lab.apiserver.protobuf import decode_object
from netagent.kube.config import PatchType

PROTOBUF = "application/vnd.kubernetes.protobuf"
APPLY_PATCH = "application/apply-patch+yaml"
_JSON_TYPES = {"", "application/json", "*/*"} | {t.value for t in PatchType}


def media_type(header: str | None) -> str:
    return (header or "").split(";")[0].strip().lower()


def decode_body(content_type: str | None, raw_body: bytes) -> object:
    """The request body as JSON data (None when empty), whatever supported type it came as."""
    kind = media_type(content_type)
    if not raw_body:
        return None
    if kind in _JSON_TYPES:
        try:
            return json.loads(raw_body)
        except ValueError as error:
            raise bad_request(f"the request body is not JSON: {error}") from None
    if kind in ("application/yaml", APPLY_PATCH):
        try:
            return yaml.safe_load(raw_body)
        except yaml.YAMLError as error:
            raise bad_request(f"the request body is not YAML: {error}") from None
    if kind == PROTOBUF:
        return decode_object(raw_body)
    raise unsupported(kind)


def unsupported(kind: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", f'the body of the request was in an unknown format - accepted '
                    f'media types include: application/json, application/yaml, {PROTOBUF} (not "{kind}")')


def patch_type_of(content_type: str | None) -> PatchType:
    kind = media_type(content_type)
    try:
        return PatchType(kind)
    except ValueError:
        raise ApiError(415, "UnsupportedMediaType", f'the media type "{kind}" is not a supported patch type: '
                       f"use {', '.join(t.value for t in PatchType)}") from None


def dry_run(query: dict[str, str], delete_options: object = None) -> bool:
    """`dryRun=All` in the query, or `dryRun: [All]` in a DELETE's DeleteOptions (kubectl delete sends that)."""
    value = query.get("dryRun")
    if value in (None, "") and isinstance(delete_options, dict):
        given = delete_options.get("dryRun") or []
        value = given[0] if isinstance(given, list) and len(given) == 1 else ",".join(map(str, given)) or None
    if value in (None, ""):
        return False
    if value != "All":
        raise bad_request(f'unsupported dry run value "{value}": only "All" is supported')
    return True


def wants_table(accept: str | None) -> bool:
    """kubectl get asks `application/json;as=Table;v=v1;g=meta.k8s.io, ... ,application/json`."""
    return any("as=table" in part.lower().replace(" ", "") and "v=v1;" in part.replace(" ", "") + ";"
               for part in (accept or "").split(","))
