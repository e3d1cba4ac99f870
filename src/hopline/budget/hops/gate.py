"""The PR gate (SPEC K): its runs, rounds, verdicts and findings."""

from __future__ import annotations

from hopline.budget.ceiling import KiB, Unit
from hopline.budget.declare import Count, HopSettings, Seconds, fixed, limit
from hopline.errors import HOP_GATE


class GateLimits(HopSettings, hop=HOP_GATE):
    """The PR gate's runs, rounds and verdicts (SPEC K)."""

    gate_concurrency: Count = limit(2, "HOPLINE_GATE_CONCURRENCY",
                                    "gate agent sessions running at once in one daemon (the others wait, "
                                    "gate_queued)", le=16)
    gate_stall_seconds: Seconds = limit(300.0, "HOPLINE_GATE_STALL_SECONDS",
                                        "a gate with no event for this long is gate_stalled (retried once, "
                                        "then error)", ge=0.05)
    max_gate_runs: Count = limit(4, "HOPLINE_MAX_GATE_RUNS",
                                 "gate runs in progress in one daemon (then 429)", le=64)
    gate_max_rounds: Count = limit(5, "HOPLINE_GATE_MAX_ROUNDS",
                                   "gate rounds of one run (--rounds: gate, dev fix, gate again...)", le=20)
    gate_runs_kept: Count = limit(32, "HOPLINE_GATE_RUNS_KEPT",
                                  "ended gate runs kept in memory (older ones are read back from the "
                                  "journal)", le=1000)
    gate_max_findings: Count = limit(200, "HOPLINE_GATE_MAX_FINDINGS",
                                     "findings kept per verdict (more are counted as omitted, never dropped "
                                     "silently)", le=10000)
    gate_message_max_chars: Count = limit(2000, "HOPLINE_GATE_MESSAGE_MAX_CHARS",
                                          "characters of a finding's message or a verdict's summary "
                                          "(longer: cut, saying how long it was)", ge=64, le=100000)

    # fixed values: constants, no variable reads them
    gate_finding_file_max_chars = fixed(1024, Unit.COUNT,
                                        "characters of a finding's file (longer: the verdict is invalid, "
                                        "asked for once more)")
    gate_finding_rule_max_chars = fixed(128, Unit.COUNT,
                                        "characters of a finding's rule id (longer: the verdict is invalid, "
                                        "asked for once more)")
    gate_git_output_max_bytes = fixed(64 * KiB, Unit.BYTES,
                                      "what one of the gate's own git commands prints (a commit id, a ref; "
                                      "more is an error)")
