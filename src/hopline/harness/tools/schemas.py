"""The tools' schemas, in OpenAI's function format (what a model is offered)."""

from __future__ import annotations

from typing import Any


def tool_schemas(names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """OpenAI function-format schemas of the named tools, in the given order."""
    return [_SCHEMAS[name] for name in names]


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


_SCHEMAS: dict[str, dict[str, Any]] = {
    "read_file": _fn("read_file", "Read a file of the workspace (or a cut tool output at @output/<id>). "
                     "Use offset/limit (bytes) to read more of a long file.",
                     {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                      "limit": {"type": "integer", "minimum": 1}}, ["path"]),
    "list_files": _fn("list_files", "List files under a directory of the workspace, with sizes.",
                      {"path": {"type": "string"}}, []),
    "search_workspace": _fn("search_workspace", "Search text (or a regex) in the workspace's files.",
                            {"query": {"type": "string"}, "path": {"type": "string"},
                             "regex": {"type": "boolean"}}, ["query"]),
    "run_command": _fn("run_command", "Run a shell command in the workspace root (timeout, output capped). "
                       "In a gate review: tests and linters only, in a sandbox; at='base' runs it on the "
                       "base commit's checkout instead of the head's. A run of the gate's test command "
                       "ends with what it showed (tests run, failed with their line, tests the base had "
                       "that the head has not); coverage=true runs it under coverage at the head and says "
                       "which lines the change adds that no test runs.",
                       {"command": {"type": "string"}, "at": {"type": "string", "enum": ["head", "base"]},
                        "coverage": {"type": "boolean"}},
                       ["command"]),
    "write_file": _fn("write_file", "Write a file of the workspace (creates parent directories).",
                      {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    "git_diff": _fn("git_diff", "The change under review as a unified diff (a gate's base..head, else the "
                    "uncommitted changes): whole, one file's (path), or the changed files with their added "
                    "and removed line counts (stat); whole=true shows the whole file as context and says "
                    "whether its behaviour (its AST, docstrings, comments and annotations aside) is the same "
                    "at both ends; added=true lists, per file, the line numbers the change adds. A long diff "
                    "is cut; read the rest as the marker says.",
                    {"path": {"type": "string"}, "stat": {"type": "boolean"}, "whole": {"type": "boolean"},
                     "added": {"type": "boolean"}},
                    []),
}
TOOL_NAMES: tuple[str, ...] = tuple(_SCHEMAS)
