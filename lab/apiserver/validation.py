"""Field validation: unknown fields dropped, or refused under `fieldValidation=Strict`.

A real server decodes a body into its Go types, so a field the type does not have is never
stored; kubectl (`--validate=strict`, its default) asks with `fieldValidation=Strict` to be
told instead, and the server answers 400 `strict decoding error: unknown field "spec.portz"`
(all of them, in one message). The types are the OpenAPI schemas `openapi.py` generates
from the client's models, so what `explain` shows and what a write may carry are one thing.
Maps (`labels`, `selector`) and free-form objects take any key. Other modes (`Warn`,
`Ignore`, none) drop the unknown fields silently.
"""
from __future__ import annotations

import enum

from lab.apiserver.errors import bad_request
from lab.apiserver.openapi import root_names, schemas
from netagent.kube.resources import Resource


class FieldValidation(enum.Enum):
    STRICT = "Strict"
    WARN = "Warn"
    IGNORE = "Ignore"

    @classmethod
    def parse(cls, text: str | None) -> FieldValidation:
        if not text:
            return cls.WARN
        try:
            return cls(text)
        except ValueError:
            raise bad_request(f'fieldValidation "{text}": must be one of Strict, Warn, Ignore') from None


def _resolve(schema: dict) -> dict:
    ref = schema.get("$ref")
    return schemas().get(ref.rsplit("/", 1)[-1], {}) if ref else schema


def _prune(value: object, schema: dict, path: str, unknown: list[str]) -> object:
    schema = _resolve(schema)
    if isinstance(value, list) and "items" in schema:
        return [_prune(item, schema["items"], f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    if "additionalProperties" in schema:
        return {k: _prune(v, schema["additionalProperties"], f"{path}.{k}", unknown) for k, v in value.items()}
    properties = schema.get("properties")
    if properties is None:
        return value  # free-form
    kept = {}
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key not in properties:
            unknown.append(where)
        else:
            kept[key] = _prune(item, properties[key], where, unknown)
    return kept


def checked_fields(resource: Resource, obj: dict, mode: FieldValidation) -> dict:
    """`obj` without the fields its type does not have; 400 for any under Strict."""
    name = root_names().get(resource)
    if name is None:
        return obj
    unknown: list[str] = []
    pruned = _prune(obj, schemas()[name], "", unknown)
    if unknown and mode is FieldValidation.STRICT:
        raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
    return pruned if isinstance(pruned, dict) else obj
