"""Writes that survive a lost answer (SPEC T-12): the SDK's policy for retrying a write.

Every write the daemon deduplicates (``POST /session``, a prompt, a cancel, a permission answer)
is sent with an ``Idempotency-Key`` made once per call, and the same key goes with each retry: a
retry of a write that did run gets the first answer, and runs nothing. So a write is retried
whenever its answer may have been lost (the connection failed before or during the answer) and
whenever the daemon said it did not run it and to try again (its owner away or changing, its store
failing for a moment, the same key being stored by another request), at most
``client_write_retry_attempts`` times, the waits doubling from ``client_write_retry_backoff_seconds``
(a longer ``Retry-After`` is waited instead, up to the client's HTTP timeout).
"""

from __future__ import annotations

import uuid

from hopline.budget import Budget

# Error types whose write was not run and that say to retry (daemon/routes/owner.py, cluster/forward.py,
# daemon/storage_faults.py, daemon/sessions/ownership.py, daemon/sessions/keys.py); status 0 is no
# answer at all (client/daemon.py's transport failures).
RETRIED: dict[int, frozenset[str]] = {
    0: frozenset({"daemon_unreachable", "connection_failed"}),
    409: frozenset({"owner_changed", "not_owner", "idempotency_key_in_use"}),
    503: frozenset({"owner_unreachable", "owner_changing", "storage_unavailable"}),
}


def new_key() -> str:
    """A write's Idempotency-Key: 32 hex characters, never reused."""
    return uuid.uuid4().hex


def retried(status: int, error_type: object) -> bool:
    return error_type in RETRIED.get(status, ())


def pause(budget: Budget, retry: int, retry_after: float | None) -> float:
    """The wait before retry number ``retry`` (from 1)."""
    wait: float = budget.client_write_retry_backoff_seconds * 2 ** (retry - 1)
    if retry_after is not None:
        wait = max(wait, min(retry_after, budget.client_http_timeout_seconds))
    return wait
