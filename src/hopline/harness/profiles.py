"""Agent profiles (SPEC H-9).

Every profile declares ``context_window`` from the budget (128,000 tokens: it describes the
model, not the transport; the transport ceiling is one setting, not repeated per agent), its
threshold, max iterations (the budget's gate value for the four gate agents), tools and prompt.
"""

from __future__ import annotations

import dataclasses

from hopline.budget import Budget
from hopline.vocabulary import GATE_AGENTS

READ_TOOLS: tuple[str, ...] = ("read_file", "list_files", "search_workspace", "run_command")
DEV_TOOLS: tuple[str, ...] = (*READ_TOOLS, "write_file")
# A gate agent reviews a change: the read tools and the change's diff (no write tool).
GATE_TOOLS: tuple[str, ...] = (*READ_TOOLS, "git_diff")

GATE_PROFILES: tuple[str, ...] = GATE_AGENTS  # a gate agent runs under the profile of its name
PROFILE_NAMES: tuple[str, ...] = ("dev", *GATE_PROFILES)

_COMMON = (
    "You work inside a workspace through tools. Paths are relative to the workspace root. "
    "Tool results longer than the cap are cut in the middle; read more with read_file offset/limit. "
    "Finish with a plain answer (no tool call) when done."
)

_PROMPTS: dict[str, str] = {
    "dev": "You are the dev agent: implement the requested change, writing files with write_file. ",
    "qa_automation": "You are the QA automation gate: run the tests, read their logs, report failures. ",
    "qa_performance_security": "You are the QA performance and security gate: look for slow paths, "
                               "resource leaks and unsafe input handling. ",
    "qa_strategy": "You are the QA strategy gate: judge test coverage and risk of the change. ",
    "appsec": "You are the application security gate: look for injection, secrets and unsafe defaults. ",
}


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    context_window: int
    compaction_threshold: float
    max_iterations: int
    tools: tuple[str, ...]
    system_prompt: str
    gate: bool

    def replace(self, **changes: object) -> Profile:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def get_profile(name: str, budget: Budget) -> Profile:
    """The named profile with its values read from ``budget``; ``KeyError`` names the choices."""
    if name not in PROFILE_NAMES:
        raise KeyError(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
    gate = name in GATE_PROFILES
    max_iterations = budget.gate_max_iterations if gate else budget.dev_max_iterations
    return Profile(
        name=name,
        context_window=budget.context_window_tokens,
        compaction_threshold=budget.compaction_threshold,
        max_iterations=max_iterations,
        tools=GATE_TOOLS if gate else DEV_TOOLS,
        system_prompt=_PROMPTS[name] + _COMMON,
        gate=gate,
    )


def model_context_window(profile: Profile, budget: Budget) -> int:
    """The window compaction works with: ``HOPLINE_MODEL_CONTEXT_WINDOW`` when the operator set it
    (they know the real model), else the profile's declared default."""
    if budget.source("model_context_window_tokens") != "default":
        return budget.model_context_window_tokens
    return profile.context_window
