"""A prompt's ACP content blocks on hop 1 (SPEC D-1, T-8): ``POST /session/{id}/prompt`` takes
``{"prompt": [ContentBlock, ...]}`` beside ``{"text": ...}``.

Each block is validated as ACP defines it (the ``agent-client-protocol`` SDK's pydantic schema:
text, image, audio, resource_link, resource), bounded (``prompt_block_max_bytes`` per block, its
compact JSON, and ``prompt_max_blocks`` blocks), and then relayed to the agent exactly as posted.
A block the agent's ``promptCapabilities`` do not allow (its ``initialize`` answer) is refused with
422 naming the block and the capability: ACP agents must take text and resource_link; image, audio
and resource (embedded context) only when they say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import orjson
from acp.schema import (
    AudioContentBlock,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    ResourceContentBlock,
    TextContentBlock,
)
from pydantic import Field, TypeAdapter, ValidationError

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_API, Budget
from hopline.daemon.errors import SessionError

# The capability of ACP's promptCapabilities each optional block kind needs (text and
# resource_link are the baseline every agent MUST support).
CAPABILITY_OF: Mapping[str, str] = {"image": "image", "audio": "audio", "resource": "embeddedContext"}

ContentBlock = Annotated[TextContentBlock | ImageContentBlock | AudioContentBlock | ResourceContentBlock
                         | EmbeddedResourceContentBlock, Field(discriminator="type")]
_BLOCKS: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])
_ERRORS_SHOWN = 4  # validation errors named in a 422 (the first ones; shape, not a payload bound)


def prompt_blocks(text: str | None, blocks: list[Any] | None, budget: Budget) -> list[dict[str, Any]]:
    """The prompt's content blocks, checked (schema, count, bytes per block), as posted; ``text``
    as its one text block."""
    if blocks is None:
        # The ``text`` form is one text block, bounded by the body limit alone: a body of exactly
        # daemon_json_body_limit bytes passes, though its block's JSON is a few bytes longer.
        return [{"type": "text", "text": text or ""}]
    limit = budget.prompt_max_blocks
    setting = CEILINGS_BY_KEY["prompt_max_blocks"].name
    message = f"a prompt has 1 to {limit} content blocks ({setting}); this one has {len(blocks)}"
    if not blocks:
        raise SessionError(422, "invalid_prompt", message)
    if len(blocks) > limit:
        raise SessionError.over_limit(422, "invalid_prompt", "prompt_max_blocks", limit, len(blocks), message,
                                      hop=HOP_DAEMON_API)
    for index, block in enumerate(blocks):
        kind = str(block.get("type"))[:32] if isinstance(block, dict) else type(block).__name__
        size, limit = len(orjson.dumps(block)), budget.prompt_block_max_bytes
        if size > limit:
            setting = CEILINGS_BY_KEY["prompt_block_max_bytes"].name
            raise SessionError.over_limit(
                413, "prompt_block_too_large", "prompt_block_max_bytes", limit, size,
                f"{HOP_DAEMON_API}: prompt block {index} ({kind}) is {size} bytes, over the limit of "
                f"{limit} bytes ({setting})", hop=HOP_DAEMON_API, block=index, blockType=kind)
    try:
        _BLOCKS.validate_python(blocks)
    except ValidationError as exc:
        errors = [{"block": e["loc"][0] if e["loc"] else None,
                   "field": ".".join(str(p) for p in e["loc"][1:]), "reason": e["msg"]}
                  for e in exc.errors(include_url=False, include_input=False)[:_ERRORS_SHOWN]]
        raise SessionError(422, "invalid_prompt",
                           "the prompt is not a list of ACP content blocks (text, image, audio, "
                           "resource_link, resource)", errors=errors) from None
    return blocks


def check_capabilities(blocks: list[dict[str, Any]], initialized: Mapping[str, Any]) -> None:
    """422 for the first block the agent's ``promptCapabilities`` do not allow."""
    caps = initialized.get("agentCapabilities")
    prompt_caps = caps.get("promptCapabilities") if isinstance(caps, Mapping) else None
    allowed = prompt_caps if isinstance(prompt_caps, Mapping) else {}
    for index, block in enumerate(blocks):
        capability = CAPABILITY_OF.get(str(block.get("type")))
        if capability is not None and allowed.get(capability) is not True:
            raise SessionError(422, "prompt_capability_missing",
                               f"prompt block {index} is {block['type']}, and the agent does not allow it: "
                               f"its promptCapabilities.{capability} is not true",
                               block=index, blockType=block["type"], capability=capability)
