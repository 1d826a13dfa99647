"""The OpenAPI v2 document in protobuf, the only form client-go reads it in.

client-go fetches `/openapi/v2` with `Accept: application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
and parses the body as gnostic's `openapi.v2.Document` message with no JSON fallback (tried:
a JSON answer fails with "proto: cannot parse invalid wire-format data"). `encode_document`
writes the JSON document `openapi.py` generates into that message: the info, the paths
(operations with their query parameters, responses and vendor extensions) and the
definitions (schemas: `$ref`, type, format, description, required, properties, items,
additionalProperties, allOf and the `x-kubernetes-*` extensions, whose values gnostic keeps
as YAML text; JSON is YAML). The field numbers are those of gnostic's OpenAPIv2.proto;
anything the generated document does not use is not written.
"""
from __future__ import annotations

import json


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    return _bytes(number, text.encode()) if text else b""


def _bool(number: int, *, value: bool) -> bytes:
    return _varint(number << 3) + b"\x01" if value else b""


def _named(name: str, value: bytes) -> bytes:
    """The Named* (name = 1, value = 2) pair messages gnostic uses for maps."""
    return _string(1, name) + _bytes(2, value)


def _extensions(number: int, node: dict) -> bytes:
    return b"".join(_bytes(number, _named(k, _string(2, json.dumps(v)))) for k, v in node.items()
                    if k.startswith("x-"))


def _schema(schema: dict) -> bytes:
    out = _string(1, schema.get("$ref", "")) + _string(2, schema.get("format", ""))
    out += _string(4, schema.get("description", ""))
    out += b"".join(_string(19, field) for field in schema.get("required", []))
    if isinstance(schema.get("additionalProperties"), dict):
        out += _bytes(21, _bytes(1, _schema(schema["additionalProperties"])))
    if "type" in schema:
        out += _bytes(22, _string(1, schema["type"]))
    if "items" in schema:
        out += _bytes(23, _bytes(1, _schema(schema["items"])))
    out += b"".join(_bytes(24, _schema(part)) for part in schema.get("allOf", []))
    if "properties" in schema:
        out += _bytes(25, b"".join(_bytes(1, _named(name, _schema(sub))) for name, sub in schema["properties"].items()))
    return out + _extensions(31, schema)


def _operation(operation: dict) -> bytes:
    out = _string(5, operation.get("operationId", ""))
    for parameter in operation.get("parameters", []):
        query = (_bool(1, value=bool(parameter.get("required"))) + _string(2, parameter.get("in", "query"))
                 + _string(4, parameter["name"]) + _string(6, parameter.get("type", "string"))
                 + _bool(20, value=bool(parameter.get("uniqueItems"))))
        out += _bytes(8, _bytes(1, _bytes(2, _bytes(3, query))))  # ParametersItem.parameter.non_body.query
    codes = b""
    for code, response in operation.get("responses", {}).items():
        body = _string(1, response.get("description", ""))
        if "schema" in response:
            body += _bytes(2, _bytes(1, _schema(response["schema"])))
        codes += _bytes(1, _named(code, _bytes(1, body)))
    return out + _bytes(9, codes) + _extensions(13, operation)


_VERBS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}


def encode_document(document: dict) -> bytes:
    info = document.get("info", {})
    out = _string(1, document.get("swagger", "2.0"))
    out += _bytes(2, _string(1, info.get("title", "")) + _string(2, info.get("version", "")))
    paths = b""
    for path, item in document.get("paths", {}).items():
        encoded = b"".join(_bytes(number, _operation(item[verb])) for verb, number in _VERBS.items() if verb in item)
        paths += _bytes(2, _named(path, encoded))
    out += _bytes(8, paths)
    definitions = b"".join(_bytes(1, _named(name, _schema(schema)))
                           for name, schema in document.get("definitions", {}).items())
    return out + _bytes(9, definitions)
