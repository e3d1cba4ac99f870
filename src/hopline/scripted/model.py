"""The offline scripted model: deterministic, seeded, the product's embedded default model.

``ScriptedModel.respond`` is a pure function of the request (the gateway's ``scripted`` provider
calls it): everything it needs comes from the body, with optional settings in
``request.params["scripted"]`` (``seed``, ``toolsPerIteration``, ``iterations``, ``writeBytes``).
Those hints come from clients, so every boundary that takes them checks them
(:mod:`hopline.scripted.hints`).

It plans like a small agent: ``list_files`` first, then ``read_file`` / ``search_workspace`` /
``run_command`` on files seen in earlier tool results; with ``write_file`` available and
``writeBytes`` set it writes files with large arguments (as a dev agent does); it answers
``purpose="summary"`` requests with a bounded summary; after ``iterations`` tool iterations it
gives a final answer. The iteration number travels in the tool call ids, so it survives compaction.

A gate prompt (:mod:`hopline.scripted.review`) makes it the named gate agent: it reads the change with
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

from hopline.budget import HOP_GATEWAY, Budget
from hopline.harness.context import SUMMARY_MARKER
from hopline.harness.failures import classify_http_status
from hopline.harness.model import EncodedRequest, LlmTurnRequest, LlmTurnResponse, Message, Usage
from hopline.harness.tokens import estimate
from hopline.scripted import review, review_fix, review_plan

PROVIDER_NAME = "scripted"
_LISTING_RE = re.compile(r"^(\d+)\t(\S+)$", re.MULTILINE)
_CALL_ID_RE = re.compile(r"^call_(\d+)_(\d+)_(\d+)$")
_PATH_RE = re.compile(r"\b[\w./-]+\.(?:py|log|md|txt|toml|json)\b")
_QUERIES = ("ERROR", "FAILED", "TODO", "def ", "timeout", "retry", "WARN")


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
