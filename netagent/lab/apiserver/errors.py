"""API errors: the one exception the server raises for a refused request, and its Status.

Anything below HTTP (selectors, patches, the store, routing) raises `ApiError`; the request
handler answers it as the Kubernetes `Status` object a client expects (404 NotFound,
409 AlreadyExists/Conflict, 400 BadRequest, 422 Invalid, 410 Expired, ...). The helpers
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


def invalid(resource: Resource, name: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{resource.kind} "{name}" is invalid: {message}', details=_details(resource, name))


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
