"""`hopline agent`'s fast start (SPEC D-9): pydantic skips the ACP models' attribute docstrings and
builds each model on first use, and the models behave exactly as they do fully built. Each side runs in
a fresh interpreter, since the step must come before the SDK is imported."""

from __future__ import annotations

import subprocess
import sys

import orjson

PROBE = """
import sys, json
if sys.argv[1] == "fast":
    from hopline.harness.acp.fast_start import skip_unused_model_work
    assert skip_unused_model_work()
import acp.schema as s
model = s.InitializeResponse
built_before_use = bool(model.__pydantic_complete__)
answer = model.model_validate({"protocolVersion": 1, "agentCapabilities": {"loadSession": True,
    "promptCapabilities": {"embeddedContext": True}}, "_meta": {"x": [1, "y"]}})
print(json.dumps({
    "description": model.model_fields["protocol_version"].description,
    "builtBeforeUse": built_before_use,
    "dumped": answer.model_dump(by_alias=True, exclude_none=True),
}))
try:
    s.TextContentBlock.model_validate({"type": "text"})  # no text
except Exception as exc:
    print(type(exc).__name__)
"""


def _probe(mode: str) -> tuple[dict[str, object], str]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, check=True,
                         timeout=60).stdout
    first, _, second = out.decode().partition("\n")
    return orjson.loads(first), second.strip()


def test_the_fast_start_skips_the_docstrings_and_the_eager_build_and_changes_nothing_else() -> None:
    fast, fast_refusal = _probe("fast")
    full, full_refusal = _probe("full")
    assert full["description"] and full["builtBeforeUse"] is True  # what the two steps skip
    assert fast["description"] is None and fast["builtBeforeUse"] is False
    assert fast["dumped"] == full["dumped"]  # validated and serialized alike
    assert fast_refusal == full_refusal == "ValidationError"  # and refused alike
