"""The offline scripted model: deterministic, seeded, the product's embedded default model.

``ScriptedModel.respond`` is a pure function of the request (the gateway's ``scripted`` provider
calls it): everything it needs comes from the body, with optional settings in
``request.params["scripted"]`` (``seed``, ``toolsPerIteration``, ``iterations``, ``writeBytes``).
Those hints come from clients, so every boundary that takes them (the daemon's ``POST /session``,
the agent's ``session/new``, the gateway's llm-turn) checks them with :func:`scripted_hints`: each
numeric hint is bounded by a ceiling of the budget (B-5), unknown hints are refused.

It plans like a small agent: ``list_files`` first, then ``read_file`` / ``search_workspace`` /
``run_command`` on files seen in earlier tool results; with ``write_file`` available and
``writeBytes`` set it writes files with large arguments (the seed's dev agent); it answers
``purpose="summary"`` requests with a bounded summary; after ``iterations`` tool iterations it
gives a final answer. The iteration number travels in the tool call ids, so it survives compaction.

A gate prompt (:mod:`hopline.harness.review`) makes it the named gate agent: it reads the change with
``git_diff`` and ends with a verdict from the review rules, exploring the changed files for the
iterations left by the ``iterations`` hint; a fix prompt makes it the dev agent that edits the
flagged lines away. Its summaries keep the latest review notes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_GATEWAY, SCRIPTED_SEED_RANGE, Budget
from hopline.errors import InputRefused
from hopline.harness import review, review_fix, review_plan
from hopline.harness.context import SUMMARY_MARKER
from hopline.harness.failures import classify_http_status
from hopline.harness.model import EncodedRequest, LlmTurnRequest, LlmTurnResponse, Message, Usage
from hopline.harness.tokens import estimate

PROVIDER_NAME = "scripted"
_LISTING_RE = re.compile(r"^(\d+)\t(\S+)$", re.MULTILINE)
_CALL_ID_RE = re.compile(r"^call_(\d+)_(\d+)_(\d+)$")
_PATH_RE = re.compile(r"\b[\w./-]+\.(?:py|log|md|txt|toml|json)\b")
_QUERIES = ("ERROR", "FAILED", "TODO", "def ", "timeout", "retry", "WARN")


# Each hint and the budget ceiling that bounds it (the seed's range is not a cost: a fixed range).
HINT_CEILINGS: dict[str, str | None] = {
    "seed": None,
    "toolsPerIteration": "scripted_max_tools_per_iteration",
    "iterations": "scripted_max_iterations",
    "writeBytes": "scripted_max_write_bytes",
}


def _hint_range(budget: Budget, key: str | None) -> tuple[int, int, str | None]:
    if key is None:
        return SCRIPTED_SEED_RANGE[0], SCRIPTED_SEED_RANGE[1], None
    return 0, int(budget.value(key)), CEILINGS_BY_KEY[key].name


def scripted_hints(raw: Any, budget: Budget, *, field: str = "scripted",
                   unknown: bool = False) -> dict[str, Any]:
    """The scripted model's hints, each an integer within its budget bound; else
    :class:`InputRefused` (``invalid_hint``) naming the hint (under ``field``), its bound and the
    value seen. Unknown hints are refused, unless ``unknown`` (the daemon relays the dict to any ACP
    agent, which may read keys of its own; hopline's agent refuses them itself)."""
    if not isinstance(raw, dict):
        raise InputRefused("invalid_hint", "scripted hints must be an object", field=field)
    for name, value in raw.items():
        if name not in HINT_CEILINGS:
            if unknown:
                continue
            raise InputRefused("invalid_hint", f"unknown scripted hint {str(name)[:64]!r} (known: "
                               f"{', '.join(HINT_CEILINGS)})", field=f"{field}.{str(name)[:64]}")
        low, high, setting = _hint_range(budget, HINT_CEILINGS[name])
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputRefused("invalid_hint", f"scripted hint {name} must be an integer from {low} to "
                               f"{high}", field=f"{field}.{name}", limit=high)
        if not low <= value <= high:
            where = f" ({setting})" if setting else ""
            raise InputRefused("invalid_hint", f"scripted hint {name}={value} is outside {low}..{high}"
                               + where,
                               field=f"{field}.{name}", limit=high, observed=value, setting=setting)
    return dict(raw)


def check_model_params(params: Any, budget: Budget) -> None:
    """The client-settable model params the scripted model reads: ``scripted`` hints and the
    summary's ``maxBytes`` (at most ``HOPLINE_SUMMARY_MAX_BYTES``)."""
    if not isinstance(params, dict):
        return
    if "scripted" in params:
        scripted_hints(params["scripted"], budget, field="params.scripted")
    if "maxBytes" in params:
        value, limit = params["maxBytes"], budget.summary_max_bytes
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise InputRefused("invalid_hint", f"params.maxBytes must be an integer from 1 to {limit} "
                               f"({CEILINGS_BY_KEY['summary_max_bytes'].name})",
                               field="params.maxBytes", limit=limit)


@dataclasses.dataclass(frozen=True)
class ScriptSettings:
    seed: int = 0
    tools_per_iteration: int = 3
    iterations: int = 6  # tool iterations before the final answer
    write_bytes: int = 0

    def merged(self, params: dict[str, Any]) -> ScriptSettings:
        raw = params.get("scripted") if isinstance(params, dict) else None
        if not isinstance(raw, dict):
            return self
        keys = {"seed": "seed", "toolsPerIteration": "tools_per_iteration", "iterations": "iterations",
                "writeBytes": "write_bytes"}
        changes = {field: raw[key] for key, field in keys.items()
                   if isinstance(raw.get(key), int) and not isinstance(raw.get(key), bool) and raw[key] >= 0}
        return dataclasses.replace(self, **changes)


_text = review.message_text


def _is_prompt(message: Message) -> bool:
    return message.get("role") == "user" and not _text(message).startswith(SUMMARY_MARKER)


def _filler(size: int, rng: random.Random) -> str:
    words = ("alpha", "beta", "gamma", "delta", "omega", "sigma")
    out: list[str] = []
    used = 0
    while used < size:
        line = " ".join(rng.choice(words) for _ in range(10))
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)[:size]


class ScriptedModel:
    """Deterministic planner over the request; see the module docstring."""

    def __init__(self, *, seed: int = 0, tools_per_iteration: int = 3, iterations: int = 6,
                 write_bytes: int = 0, summary_max_bytes: int | None = None) -> None:
        self.settings = ScriptSettings(seed, tools_per_iteration, iterations, write_bytes)
        self.summary_max_bytes = (summary_max_bytes if summary_max_bytes is not None
                                  else Budget.defaults().summary_max_bytes)

    def respond(self, request: LlmTurnRequest) -> LlmTurnResponse:
        settings = self.settings.merged(request.params)
        summary = request.purpose == "summary"
        message = self._summary(request) if summary else self._turn(request, settings)
        usage = Usage(estimate(request.messages), estimate([message]))
        return LlmTurnResponse(message, usage, PROVIDER_NAME)

    # --- summaries -------------------------------------------------------------------------------

    def _summary(self, request: LlmTurnRequest) -> Message:
        max_bytes = request.params.get("maxBytes")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            max_bytes = self.summary_max_bytes
        text = "\n".join(_text(m) for m in request.messages if m.get("role") == "user")
        paths = sorted(set(_PATH_RE.findall(text)))
        tools = {name: text.count(f"[call {name} ") for name in
                 ("read_file", "list_files", "search_workspace", "run_command", "write_file")}
        errors = text.count("ERROR")
        lines = [f"Scripted summary of {len(text.encode('utf-8'))} bytes of transcript.",
                 "Tool calls: " + ", ".join(f"{k} x{v}" for k, v in tools.items() if v),
                 f"ERROR lines seen: {errors}.",
                 "Files: " + ", ".join(paths[:40])]
        notes = review.notes_line(text)  # a reviewer's findings so far outlive the summarized part
        if notes is not None:
            lines.insert(1, notes)
        previous = re.search(r"Summary so far:\n(.*?)\n\nTranscript", text, re.DOTALL)
        if previous:
            lines.append("Earlier: " + previous.group(1)[:max_bytes // 2].replace("\n", " "))
        summary = "\n".join(lines).encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")
        return {"role": "assistant", "content": summary}

    # --- turns -----------------------------------------------------------------------------------

    def _turn(self, request: LlmTurnRequest, settings: ScriptSettings) -> Message:
        messages = request.messages
        turn = sum(1 for m in messages if _is_prompt(m))
        last_prompt = max((i for i, m in enumerate(messages) if _is_prompt(m)), default=-1)
        iteration = 1
        for message in reversed(messages[last_prompt + 1:]):
            ids = [c.get("id", "") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            parsed = [_CALL_ID_RE.match(i) for i in ids if isinstance(i, str)]
            numbers = [int(p.group(2)) for p in parsed if p]
            if numbers:
                iteration = max(numbers) + 1
                break
        tools = {t.get("function", {}).get("name") for t in request.tools if isinstance(t, dict)}
        rng = random.Random(f"{settings.seed}:{turn}:{iteration}")
        prompt = _text(messages[last_prompt]) if last_prompt >= 0 else ""
        step = self._review_or_fix(messages, prompt, tools, settings, iteration, rng)
        if step is not None:
            return self._answer(step, turn, iteration)
        if iteration > settings.iterations:
            seen = self._seen_files(messages)
            return {"role": "assistant",
                    "content": f"Done after {iteration - 1} tool iterations: reviewed {len(seen)} files; "
                               "no blocking issue found in the sampled logs."}
        calls = self._plan(messages, tools, settings, rng, iteration)
        content = "" if iteration > 1 else "Looking at the workspace first."
        return {"role": "assistant", "content": content,
                "tool_calls": [{"id": f"call_{turn}_{iteration}_{j}", "type": "function",
                                "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
                               for j, (name, args) in enumerate(calls)]}

    @staticmethod
    def _review_or_fix(messages: list[Message], prompt: str, tools: set[Any], settings: ScriptSettings,
                       iteration: int, rng: random.Random) -> review_plan.Step | None:
        """A gate agent's or the fixing dev agent's step, when the prompt is one of theirs."""
        agent = review.gate_agent_of(prompt)
        if agent is not None:
            return review_plan.review_step(agent, messages, tools, per_iteration=settings.tools_per_iteration,
                                      iteration=iteration, explore_until=settings.iterations,
                                      pick=rng.choice)
        findings = review.fix_findings_of(prompt)
        if findings is not None:
            return review_fix.fix_step(findings, messages, tools, review.test_command_of(prompt))
        return None

    @staticmethod
    def _answer(step: review_plan.Step, turn: int, iteration: int) -> Message:
        if not step.calls:
            return {"role": "assistant", "content": step.content}
        return {"role": "assistant", "content": step.content,
                "tool_calls": [{"id": f"call_{turn}_{iteration}_{j}", "type": "function",
                                "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
                               for j, (name, args) in enumerate(step.calls)]}

    @staticmethod
    def _seen_files(messages: list[Message]) -> list[tuple[int, str]]:
        seen: dict[str, int] = {}
        for message in messages:
            if message.get("role") == "tool":
                for size, path in _LISTING_RE.findall(_text(message)):
                    seen[path] = int(size)
        return sorted((size, path) for path, size in seen.items())

    def _plan(self, messages: list[Message], tools: set[Any], settings: ScriptSettings,
              rng: random.Random, iteration: int) -> list[tuple[str, dict[str, Any]]]:
        count = max(1, settings.tools_per_iteration)
        if "write_file" in tools and settings.write_bytes > 0:
            return [("write_file", {"path": f"generated/iter{iteration}_{j}.txt",
                                    "content": _filler(settings.write_bytes, rng)}) for j in range(count)]
        seen = self._seen_files(messages)
        if not seen and "list_files" in tools:
            return [("list_files", {"path": "."})]
        paths = [p for _, p in seen] or ["README.md"]
        big = [p for s, p in seen if s >= 64 * 1024] or paths
        kinds = [k for k in ("read_file", "run_command", "search_workspace") if k in tools] or ["read_file"]
        calls: list[tuple[str, dict[str, Any]]] = []
        for j in range(count):
            kind = kinds[(iteration + j) % len(kinds)]
            if kind == "read_file":
                calls.append(("read_file", {"path": rng.choice(big)}))
            elif kind == "run_command":
                calls.append(("run_command", {"command": f"cat {rng.choice(big)}"}))
            else:
                calls.append(("search_workspace", {"query": rng.choice(_QUERIES)}))
        return calls


class InProcessModel:
    """The scripted model as an async :class:`Model`, optionally refusing bodies like a gateway.

    ``max_body_bytes`` makes it answer a larger body with the gateway's 413 (origin ``code``), as
    the embedded gateway would; ``sizes`` records every body it received.
    """

    def __init__(self, scripted: ScriptedModel, *, max_body_bytes: int | None = None) -> None:
        self.scripted = scripted
        self.max_body_bytes = max_body_bytes
        self.sizes: list[int] = []
        self.requests: list[LlmTurnRequest] = []

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        self.sizes.append(encoded.size)
        self.requests.append(encoded.request)
        if self.max_body_bytes is not None and encoded.size > self.max_body_bytes:
            raise classify_http_status(413, "request entity too large", hop=HOP_GATEWAY,
                                       body_bytes=encoded.size, limit_bytes=self.max_body_bytes)
        await asyncio.sleep(0)  # a real await point, so cancellation can land here
        return self.scripted.respond(encoded.request)
