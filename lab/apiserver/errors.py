"""API errors: the one exception the server raises for a refused request, and its Status.

Anything below HTTP (selectors, patches, the store, routing) raises `ApiError`; the request
handler answers it as the Kubernetes `Status` object a client expects (404 NotFound,
409 AlreadyExists/Conflict, 400 BadRequest, 422 Invalid, 410 Expired, ...), a reason left
out where the real server leaves it out. The helpers
build the common ones with the real server's wording and `details`, so every layer says
"not found" the same way. A leaf module: it imports nothing of the package.
"""
from __future__ import annotations

from netagent.kube.resources import Resource


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, *, details: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:  # the real server's bare 500s (a watch from an unparsable resourceVersion) have none
            del status["reason"]
        if self.details:
            status["details"] = self.details
        return status


def _details(resource: Resource, name: str) -> dict:
    details = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    return details


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource.plural} "{name}" not found', details=_details(resource, name))


def already_exists(resource: Resource, name: str) -> ApiError:
    message = f'{resource.plural} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, details=_details(resource, name))


def conflict(resource: Resource, name: str, *, given: str, current: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'{resource.plural} "{name}": resourceVersion {given} is stale (now {current}); '
        "read the object again and retry",
        details=_details(resource, name),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


_CAUSE_REASONS = {
    "Required value": "FieldValueRequired",
    "Invalid value": "FieldValueInvalid",
    "Duplicate value": "FieldValueDuplicate",
    "Unsupported value": "FieldValueNotSupported",
    "Forbidden": "FieldValueForbidden",
    "Too many": "FieldValueTooMany",
}


def _cause(error: str) -> dict:
    """`field: Kind of problem: detail` (the registry's wording) as a StatusCause."""
    field, _, rest = error.partition(": ")
    if not rest or " " in field:
        return {"reason": "FieldValueInvalid", "message": error, "field": ""}
    reason = next((r for prefix, r in _CAUSE_REASONS.items() if rest.startswith(prefix)), "FieldValueInvalid")
    return {"reason": reason, "message": rest, "field": field}


def invalid(resource: Resource, name: str, errors: str | list[str]) -> ApiError:
    """422 Invalid with one StatusCause per field error, as kubectl prints them."""
    errors = [errors] if isinstance(errors, str) else errors
    message = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    details = {**_details(resource, name), "kind": resource.kind, "causes": [_cause(e) for e in errors]}
    return ApiError(422, "Invalid", f'{resource.kind} "{name}" is invalid: {message}', details=details)


def invalid_list_options(errors: str | list[str]) -> ApiError:
    """422 Invalid for request options the real server validates as `ListOptions` (the
    `resourceVersionMatch` and `sendInitialEvents` rules), one StatusCause each, in its wording."""
    errors = [errors] if isinstance(errors, str) else errors
    message = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    details = {"group": "meta.k8s.io", "kind": "ListOptions", "causes": [_cause(e) for e in errors]}
    return ApiError(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {message}', details=details)


def invalid_resource_version(text: str, *, watch: bool) -> ApiError:
    """A resourceVersion that is not a number, as the real server answers it: a list 400
    BadRequest, a watch a bare 500 (its storage layer's parse error, no reason)."""
    parse_error = f'resourceVersion: Invalid value: "{text}": strconv.ParseUint: parsing "{text}": invalid syntax'
    if watch:
        return ApiError(500, "", parse_error)
    return ApiError(400, "BadRequest", f"invalid resource version: {parse_error}")


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_large_resource_version(given: int, current: int) -> ApiError:
    """What the real server answers a list or watch from a revision it has not reached (after
    waiting for it): 504 Timeout with a ResourceVersionTooLarge cause and a retry hint."""
    message = f"Too large resource version: {given}, current: {current}"
    details = {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
               "retryAfterSeconds": 1}
    return ApiError(504, "Timeout", message, details=details)
