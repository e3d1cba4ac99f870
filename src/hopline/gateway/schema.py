"""The llm-turn request body's shape (SPEC G-1, H-1), validated with pydantic for field-named errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str  # a JSON string, as in the OpenAI chat shape


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tool_message_answers_a_call(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self


class LlmTurnBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    model: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    purpose: Literal["turn", "summary"] = "turn"


def field_errors(exc: ValidationError) -> list[dict[str, str]]:
    """Each problem as ``{"field": "messages.2.role", "message": ...}``."""
    out = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in error["loc"]) or "(body)"
        out.append({"field": loc, "message": error["msg"]})
    return out
