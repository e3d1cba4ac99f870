"""Prompt content blocks a client builds (SPEC D-1, T-8): a text, and files attached to it.

An attached file is an ACP ``resource_link`` (its ``file:`` URI, name, media type and size: the agent
reads it itself, inside its session's cwd), or an ``image`` block (base64 data) for an image file,
which the daemon relays only to an agent whose promptCapabilities take images.
"""

from __future__ import annotations

import base64
import mimetypes
from pathlib import Path
from typing import Any


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def attachment_block(path: str | Path) -> dict[str, Any]:
    """The block for one attached file: an image block for an image file, else a resource_link."""
    file = Path(path).resolve()
    media, _ = mimetypes.guess_type(file.name)
    if media is not None and media.startswith("image/"):
        return {"type": "image", "mimeType": media, "data": base64.b64encode(file.read_bytes()).decode(),
                "uri": file.as_uri()}
    block: dict[str, Any] = {"type": "resource_link", "uri": file.as_uri(), "name": file.name,
                             "size": file.stat().st_size}
    if media is not None:
        block["mimeType"] = media
    return block


def prompt_with_attachments(text: str, attachments: list[str | Path]) -> list[dict[str, Any]]:
    return [text_block(text), *(attachment_block(a) for a in attachments)]
