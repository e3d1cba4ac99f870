"""An agent's failure as the client sees it (daemon.errors): its JSON-RPC error message and data are
echoed up to their ceilings, whole at the limit, cut (message) or replaced by their size (data) one
byte over (pure)."""

from __future__ import annotations

import orjson

from hopline.budget import Budget
from hopline.daemon.child import AgentExited, AgentRpcError
from hopline.daemon.errors import agent_failure, echoed_message

BUDGET = Budget.defaults()


def refusal(message: str, data: object = None) -> dict[str, object]:
    failure = agent_failure(AgentRpcError({"code": -32000, "message": message, "data": data}),
                            "session/new", BUDGET)
    assert failure is not None and failure.status == 422
    error: dict[str, object] = failure.body["error"]
    return error


def test_an_agent_message_at_its_ceiling_is_echoed_whole_and_one_byte_over_is_cut_saying_so() -> None:
    limit = BUDGET.error_message_echo_max_bytes
    whole = refusal("m" * limit)
    assert whole["message"] == "the agent refused session/new: " + "m" * limit
    assert "omittedMessageBytes" not in whole
    over = refusal("m" * (limit + 1))
    assert over["message"] == "the agent refused session/new: " + "m" * limit + " … (1 more bytes)"
    assert over["omittedMessageBytes"] == 1
    huge = refusal("é" * (10 * limit))  # 2 bytes a character: cut between characters, never inside one
    assert huge["omittedMessageBytes"] == 20 * limit - limit
    assert echoed_message("aé", 2) == ("a", 2)


def test_agent_error_data_at_its_ceiling_is_echoed_and_one_byte_over_only_its_size() -> None:
    limit = BUDGET.error_data_echo_max_bytes
    at_limit = "d" * (limit - 2)  # orjson adds the two quotes
    assert len(orjson.dumps(at_limit)) == limit
    assert refusal("no", at_limit)["data"] == at_limit
    assert refusal("no", at_limit + "d")["data"] == {"omittedBytes": limit + 1}
    assert refusal("no")["data"] is None


def test_an_exit_is_a_502_and_other_errors_are_not_an_agent_failure() -> None:
    exited = agent_failure(AgentExited(3), "session/load", BUDGET)
    assert exited is not None and (exited.status, exited.body["error"]["exitCode"]) == (502, 3)
    assert agent_failure(ValueError("x"), "session/new", BUDGET) is None
