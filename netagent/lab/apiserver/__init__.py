"""The Kubernetes API test server, as a package (the code is in `server.py` for now)."""
from netagent.lab.apiserver.server import (
    ApiError,
    ApiServer,
    LabelSelector,
    StoreEvent,
    Subresource,
    json_patch,
    merge_patch,
)

__all__ = ["ApiError", "ApiServer", "LabelSelector", "StoreEvent", "Subresource", "json_patch", "merge_patch"]
