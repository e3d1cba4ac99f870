"""What `hopline agent` makes of a prompt's ACP content blocks (SPEC H-10, T-8).

It supports every block it advertises (:data:`PROMPT_CAPABILITIES`):

- ``text``: the text;
- ``resource_link`` (the baseline every ACP agent MUST take): a file inside the session's cwd is
  read through the same confined reader as the ``read_file`` tool (no escape by ``..`` or a
  symlink), and what the model gets is capped by the tool-result ceiling
  (``HOPLINE_TOOL_RESULT_MAX_BYTES``), saying how to read the rest. A link outside the cwd, or not a
  ``file:`` URI, or not a readable file, reaches the model as the link's text only, and the agent
  says (an ``agent_message_chunk``) that it did not read it;
- ``resource`` (embedded context): its text, or for a binary resource a line naming it and its size.

Images and audio are not advertised: the harness's models (the scripted model and the
chat-completions gateway form) take text only, so a client is told up front (the daemon refuses
such blocks with 422) rather than have them silently ignored. Should one arrive anyway, the model
gets a line saying it was not shown.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import urllib.parse
from pathlib import Path
from typing import Any

from acp.schema import PromptCapabilities

from hopline.budget import Budget
from hopline.harness.tools import ToolError, Workspace

# promptCapabilities of the initialize answer: embedded context yes; image, audio no.
PROMPT_CAPABILITIES = PromptCapabilities(image=False, audio=False, embedded_context=True)


@dataclasses.dataclass(frozen=True)
class PromptContent:
    text: str  # what the model gets as the user's turn
    not_read: tuple[str, ...] = ()  # links the agent did not read (it says so)

    def said(self) -> list[str]:
        """What the agent tells the user about the links it did not read."""
        return [f"I did not read the linked file {link}; the model got the link only.\n"
                for link in self.not_read]


def _block_dict(block: Any) -> dict[str, Any]:
    if hasattr(block, "model_dump"):
        dumped: dict[str, Any] = block.model_dump(by_alias=True, exclude_none=True)
        return dumped
    return dict(block) if isinstance(block, dict) else {}


def echo_blocks(blocks: list[Any]) -> list[dict[str, Any]]:
    """The prompt's blocks as ACP JSON, for the ``user_message_chunk`` echo (one per block)."""
    return [_block_dict(b) for b in blocks]


def _link_path(uri: str, root: Path) -> str:
    """The workspace-relative path of a ``file:`` URI (or a relative path), or ToolError."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme not in ("", "file") or parsed.netloc not in ("", "localhost"):
        raise ToolError("not a file: URI")
    path = urllib.parse.unquote(parsed.path)
    if not path:
        raise ToolError("an empty path")
    if Path(path).is_absolute():
        candidate = Path(path)
        if not candidate.resolve().is_relative_to(root):
            raise ToolError("outside the session's workspace")
        return candidate.resolve().relative_to(root).as_posix() or "."
    return path


def _read_link(block: dict[str, Any], workspace: Workspace) -> str:
    """The file a resource_link names, as the read_file tool gives it to the model."""
    path = _link_path(str(block.get("uri", "")), workspace.root)
    outcome = workspace.read_file({"path": path})
    return outcome.model_output


def _embedded_text(block: dict[str, Any]) -> str:
    resource = block.get("resource")
    resource = resource if isinstance(resource, dict) else {}
    uri = str(resource.get("uri", ""))
    if isinstance(resource.get("text"), str):
        return f"[embedded resource {uri}]\n{resource['text']}"
    blob = resource.get("blob")
    try:
        size = len(base64.b64decode(blob, validate=True)) if isinstance(blob, str) else 0
    except (binascii.Error, ValueError):
        size = len(blob) if isinstance(blob, str) else 0
    media = resource.get("mimeType", "unknown type")
    return f"[embedded resource {uri}: binary ({media}, {size} bytes), not shown]"


def prompt_content(blocks: list[Any], cwd: str, budget: Budget) -> PromptContent:
    """The model's text for a prompt's blocks. Blocking (it reads files): call it off the loop."""
    parts: list[str] = []
    not_read: list[str] = []
    workspace: Workspace | None = None
    try:
        for block in (_block_dict(b) for b in blocks):
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "resource_link":
                name = str(block.get("name") or block.get("uri") or "")
                uri = str(block.get("uri", ""))
                try:
                    if workspace is None:
                        workspace = Workspace(Path(cwd), budget)
                    parts.append(f"[file {name} ({uri})]\n{_read_link(block, workspace)}")
                except (ToolError, ValueError, OSError) as exc:
                    reason = str(exc).removeprefix("error: ") or type(exc).__name__
                    parts.append(f"[link {name}: {uri} (not read: {reason})]")
                    not_read.append(f"{name} ({reason})")
            elif kind == "resource":
                parts.append(_embedded_text(block))
            elif kind in ("image", "audio"):
                parts.append(f"[{kind} ({block.get('mimeType', 'unknown type')}): not shown to the model, "
                             "which takes text only]")
    finally:
        if workspace is not None:
            workspace.close()
    return PromptContent("\n".join(parts), tuple(not_read))
