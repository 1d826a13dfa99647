"""Protobuf request bodies: what kubectl's typed commands send (`create namespace`, `create service`).

kubectl sends the objects it builds itself as `application/vnd.kubernetes.protobuf`, and
client-go does not fall back to JSON when the server answers 415 (tried: kubectl v1.37
prints the 415 and gives up), so the server must read them. The envelope is Kubernetes'
`runtime.Unknown` behind the 4-byte magic `k8s\\0`: the TypeMeta, then the object's own
message. The field numbers below are those of Kubernetes' `generated.proto` for the
messages these commands send (Namespace, Service, their metadata, spec and status), checked
against kubectl's own request dumps (`-v=8`). The result is the object as JSON data, the
zero values Go's protobuf encoder writes for unset fields dropped, as JSON's `omitempty`
would. A field or kind not in the tables is a 400 naming it (use JSON for it: `kubectl
apply -f`); nothing is guessed.
"""
from __future__ import annotations

from lab.apiserver.errors import bad_request

MAGIC = b"k8s\x00"
STRING, INT, BOOL, MAP, BYTES = "string", "int", "bool", "map", "bytes"

# message -> field number -> (JSON name, type: a scalar above or a message name, repeated)
MESSAGES: dict[str, dict[int, tuple[str, str, bool]]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta", False), 2: ("raw", BYTES, False), 3: ("contentEncoding", STRING, False),
                4: ("contentType", STRING, False)},
    "TypeMeta": {1: ("apiVersion", STRING, False), 2: ("kind", STRING, False)},
    "Time": {1: ("seconds", INT, False), 2: ("nanos", INT, False)},
    "ObjectMeta": {1: ("name", STRING, False), 2: ("generateName", STRING, False), 3: ("namespace", STRING, False),
                   4: ("selfLink", STRING, False), 5: ("uid", STRING, False), 6: ("resourceVersion", STRING, False),
                   7: ("generation", INT, False), 8: ("creationTimestamp", "Time", False),
                   9: ("deletionTimestamp", "Time", False), 10: ("deletionGracePeriodSeconds", INT, False),
                   11: ("labels", MAP, True), 12: ("annotations", MAP, True), 14: ("finalizers", STRING, True)},
    "Namespace": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "NamespaceSpec", False),
                  3: ("status", "NamespaceStatus", False)},
    "NamespaceSpec": {1: ("finalizers", STRING, True)},
    "NamespaceStatus": {1: ("phase", STRING, False)},
    "Service": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "ServiceSpec", False),
                3: ("status", "ServiceStatus", False)},
    "ServiceSpec": {1: ("ports", "ServicePort", True), 2: ("selector", MAP, True), 3: ("clusterIP", STRING, False),
                    4: ("type", STRING, False), 5: ("externalIPs", STRING, True),
                    7: ("sessionAffinity", STRING, False), 8: ("loadBalancerIP", STRING, False),
                    9: ("loadBalancerSourceRanges", STRING, True), 10: ("externalName", STRING, False),
                    11: ("externalTrafficPolicy", STRING, False), 12: ("healthCheckNodePort", INT, False),
                    13: ("publishNotReadyAddresses", BOOL, False), 17: ("ipFamilyPolicy", STRING, False),
                    18: ("clusterIPs", STRING, True), 19: ("ipFamilies", STRING, True)},
    "ServicePort": {1: ("name", STRING, False), 2: ("protocol", STRING, False), 3: ("port", INT, False),
                    4: ("targetPort", "IntOrString", False), 5: ("nodePort", INT, False),
                    6: ("appProtocol", STRING, False)},
    "IntOrString": {1: ("type", INT, False), 2: ("intVal", INT, False), 3: ("strVal", STRING, False)},
    "ServiceStatus": {1: ("loadBalancer", "LoadBalancerStatus", False)},
    "LoadBalancerStatus": {},
    "MapEntry": {1: ("key", STRING, False), 2: ("value", STRING, False)},
}
KINDS = {("v1", "Namespace"), ("v1", "Service")}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise bad_request("the protobuf body ends inside a number")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for every field of one message."""
    fields: list[tuple[int, int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            fields.append((number, wire, value))
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise bad_request("the protobuf body ends inside a field")
            fields.append((number, wire, data[at:at + length]))
            at += length
        else:
            raise bad_request(f"protobuf wire type {wire} is not used by the kinds this server decodes")
    return fields


def _message(name: str, data: bytes) -> dict:
    schema = MESSAGES[name]
    result: dict = {}
    for number, wire, raw in _fields(data):
        if number not in schema:
            raise bad_request(f"protobuf field {number} of {name} is not known to the lab API server; send JSON "
                              "(kubectl apply -f / create -f) for it")
        field, kind, repeated = schema[number]
        value: object
        if kind == MAP:
            entry = _message("MapEntry", raw if isinstance(raw, bytes) else b"")
            result.setdefault(field, {})[entry.get("key", "")] = entry.get("value", "")
            continue
        if kind in (INT, BOOL):
            value = bool(raw) if kind == BOOL else raw
        elif not isinstance(raw, bytes) or wire != 2:
            raise bad_request(f"protobuf field {name}.{field} has the wrong wire type")
        elif kind == STRING:
            value = raw.decode()
        elif kind == BYTES:
            value = raw
        else:
            value = _message(kind, raw)
        if repeated:
            result.setdefault(field, []).append(value)
        else:
            result[field] = value
    return _as_json(name, result)


def _as_json(name: str, decoded: dict) -> dict:
    if name == "IntOrString":
        return {"value": decoded.get("strVal", "") if decoded.get("type") == 1 else decoded.get("intVal", 0)}
    cleaned = {}
    for key, value in decoded.items():
        if isinstance(value, dict) and set(value) == {"value"} and key in ("targetPort",):
            value = value["value"]
        if isinstance(value, dict) and {"seconds", "nanos"} >= set(value) and key.endswith("Timestamp"):
            continue  # an unset Time; a client never sets the server's timestamps
        if value in ("", 0, False, None, {}, []) and not (key == "port" and name == "ServicePort"):
            continue
        cleaned[key] = value
    return cleaned


def decode_object(body: bytes) -> dict:
    """A protobuf-encoded Namespace or Service as its JSON object."""
    if not body.startswith(MAGIC):
        raise bad_request("the protobuf body does not start with the Kubernetes magic number")
    envelope = _message("Unknown", body[len(MAGIC):])
    type_meta = envelope.get("typeMeta") or {}
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    if (api_version, kind) not in KINDS:
        raise bad_request(f"the lab API server decodes protobuf only for {sorted(k for _, k in KINDS)}, not "
                          f"{api_version}/{kind}; send JSON")
    raw = envelope.get("raw") or b""
    return {"apiVersion": api_version, "kind": kind, **_message(kind, raw if isinstance(raw, bytes) else b"")}
