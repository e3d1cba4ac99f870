"""Sidecars for large payloads (SPEC S-1..S-4): store, projection, access route, agent writer.

A package of its own because both the daemon (projection, route) and the agent (direct writes,
S-3) use it, and nothing below the daemon may import the daemon.

The route module imports FastAPI; import it as ``hopline.sidecars.routes`` so the agent
side (``.writer``) stays light.
"""

from hopline.sidecars.entry import FALLBACK_KEYS, SidecarEntry, SidecarRefused, is_valid_sidecar_id
from hopline.sidecars.projection import (
    JSON_MEDIA_TYPE,
    TEXT_MEDIA_TYPE,
    preview_text,
    project_fields,
    restore_update,
)
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.store_projection import (
    aproject_message,
    needs_projection,
    project_message,
    project_update,
    sidecar_projector,
)

__all__ = [
    "FALLBACK_KEYS",
    "JSON_MEDIA_TYPE",
    "TEXT_MEDIA_TYPE",
    "SidecarEntry",
    "SidecarRefused",
    "SidecarStore",
    "aproject_message",
    "is_valid_sidecar_id",
    "needs_projection",
    "preview_text",
    "project_fields",
    "project_message",
    "project_update",
    "restore_update",
    "sidecar_projector",
]
