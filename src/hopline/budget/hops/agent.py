"""The agent's harness: its context manager, its tool loop and the sandbox of its commands."""

from __future__ import annotations

from hopline.budget.ceiling import GiB, KiB, MiB, Unit
from hopline.budget.declare import Bytes, Count, HopSettings, Seconds, Tokens, fixed, limit
from hopline.errors import HOP_CONTEXT, HOP_TOOLS


class ContextLimits(HopSettings, hop=HOP_CONTEXT):
    """The agent's context manager: its window, compaction and summaries."""

    model_context_window_tokens: Tokens = limit(128_000, "HOPLINE_MODEL_CONTEXT_WINDOW",
                                                "the real model's context window: when set, it overrides "
                                                "the profile's", common=True)
    bytes_per_token: Count = limit(4, "HOPLINE_BYTES_PER_TOKEN",
                                   "approximate tokenizer: bytes per token", le=64)
    summary_chunk_bytes: Bytes = limit(2 * MiB, "HOPLINE_SUMMARY_CHUNK_BYTES",
                                       "old history sent in one summarization request")
    summary_max_bytes: Bytes = limit(16 * KiB, "HOPLINE_SUMMARY_MAX_BYTES", "one summary message")

    # fixed values: constants, no variable reads them
    context_window_tokens = fixed(128_000, Unit.TOKENS, "model context window (declared per agent profile)")
    compaction_threshold = fixed(0.7, Unit.RATIO,
                                 "compact when estimate > threshold x effective window (per profile)",
                                 ge=0.05, le=0.95)
    summary_request_overhead_bytes = fixed(64 * KiB, Unit.BYTES,
                                           "room reserved in a summarization request for its prompt and "
                                           "JSON framing")
    summary_frame_bytes = fixed(512, Unit.BYTES,
                                "room reserved for a summary message's framing (marker, counts, JSON keys) "
                                "beyond its text")


class ToolLimits(HopSettings, hop=HOP_TOOLS):
    """The agent's tool loop, its commands and their sandbox."""

    tool_result_max_bytes: Bytes = limit(32 * KiB, "HOPLINE_TOOL_RESULT_MAX_BYTES",
                                         "one tool result, as given to the model")
    tool_arguments_max_bytes: Bytes = limit(256 * KiB, "HOPLINE_TOOL_ARGUMENTS_MAX_BYTES",
                                            "one tool call's JSON arguments")
    tool_calls_per_iteration_max: Count = limit(8, "HOPLINE_TOOL_CALLS_PER_ITERATION",
                                                "tool calls executed from one model answer")
    plan_max_entries: Count = limit(16, "HOPLINE_PLAN_MAX_ENTRIES",
                                    "entries of the ACP plan update (older finished iterations fold into "
                                    "one)", ge=2, le=256)
    command_timeout_seconds: Seconds = limit(30.0, "HOPLINE_COMMAND_TIMEOUT",
                                             "run_command wall-clock timeout", ge=0.01)
    command_output_max_bytes: Bytes = limit(4 * MiB, "HOPLINE_COMMAND_OUTPUT_MAX_BYTES",
                                            "run_command output captured before the cap")
    sandbox_cpu_seconds: Seconds = limit(300.0, "HOPLINE_SANDBOX_CPU_SECONDS",
                                         "CPU time of one sandboxed command (RLIMIT_CPU, whole seconds, "
                                         "rounded up)")
    sandbox_memory_bytes: Bytes = limit(4 * GiB, "HOPLINE_SANDBOX_MEMORY_BYTES",
                                        "address space of each process of a sandboxed command (RLIMIT_AS)",
                                        ge=64 * MiB)
    sandbox_max_processes: Count = limit(512, "HOPLINE_SANDBOX_MAX_PROCESSES",
                                         "processes of a sandboxed command: as root, the pids.max of a pids "
                                         "cgroup of its own (RLIMIT_NPROC does not bind root); otherwise "
                                         "RLIMIT_NPROC", ge=8)
    sandbox_file_max_bytes: Bytes = limit(256 * MiB, "HOPLINE_SANDBOX_FILE_MAX_BYTES",
                                          "one file a sandboxed command writes (RLIMIT_FSIZE)", ge=64 * KiB)
    sandbox_tmpfs_bytes: Bytes = limit(1 * GiB, "HOPLINE_SANDBOX_TMPFS_BYTES",
                                       "the private writable tmpfs of a sandboxed command (caches, build "
                                       "output)", ge=1 * MiB)
    gate_test_timeout_seconds: Seconds = limit(240.0, "HOPLINE_GATE_TEST_TIMEOUT",
                                               "wall-clock time of the test command a gate runs (under "
                                               "HOPLINE_GATE_STALL_SECONDS)", ge=0.1)
    search_max_matches: Count = limit(200, "HOPLINE_SEARCH_MAX_MATCHES", "search_workspace matches")
    search_max_file_bytes: Bytes = limit(2 * MiB, "HOPLINE_SEARCH_MAX_FILE_BYTES",
                                         "search_workspace skips larger files")

    # fixed values: constants, no variable reads them
    gate_max_iterations = fixed(60, Unit.COUNT, "tool-loop iterations of a gate agent (per profile)")
    dev_max_iterations = fixed(40, Unit.COUNT, "tool-loop iterations of the dev agent (per profile)")
