"""Where state lives: the journal's queue, sidecars, and several daemons on one store."""

from __future__ import annotations

from hopline.budget.ceiling import GiB, KiB, MiB, Unit
from hopline.budget.declare import Bytes, Count, HopSettings, Ratio, Seconds, fixed, limit
from hopline.errors import HOP_CLUSTER, HOP_JOURNAL, HOP_SIDECARS


class JournalLimits(HopSettings, hop=HOP_JOURNAL):
    """The journal's queue between the pipe readers and its writer."""

    journal_queue_max_events: Count = limit(4096, "HOPLINE_JOURNAL_QUEUE_MAX_EVENTS",
                                            "events handed to the journal's writer and not yet committed; "
                                            "past it the pipe readers stop reading their children until the "
                                            "writer catches up")
    journal_queue_max_bytes: Bytes = limit(16 * MiB, "HOPLINE_JOURNAL_QUEUE_MAX_BYTES",
                                           "data bytes of those events; past it the pipe readers stop "
                                           "reading their children")
    journal_queue_share_max_events: Count = limit(512, "HOPLINE_JOURNAL_QUEUE_SHARE_MAX_EVENTS",
                                                  "while other sessions compete, one session's events in "
                                                  "that queue (or the queue's bound divided by the "
                                                  "sessions, when lower); past it that session's pipe "
                                                  "reader waits: another session's events queue behind at "
                                                  "most this many of a flood's")


class SidecarLimits(HopSettings, hop=HOP_SIDECARS):
    """Sidecars: large tool output kept off the wire."""

    sidecar_threshold_bytes: Bytes = limit(64 * KiB, "HOPLINE_SIDECAR_THRESHOLD_BYTES",
                                           "a tool output field larger than this goes to a sidecar")
    sidecar_preview_bytes: Bytes = limit(2 * KiB, "HOPLINE_SIDECAR_PREVIEW_BYTES",
                                         "preview kept on the wire (head and tail); no field this size or "
                                         "smaller moves to a sidecar")
    sidecar_max_object_bytes: Bytes = limit(64 * MiB, "HOPLINE_SIDECAR_MAX_OBJECT_BYTES",
                                            "one sidecar object")
    sidecar_max_session_bytes: Bytes = limit(256 * MiB, "HOPLINE_SIDECAR_MAX_SESSION_BYTES",
                                             "sidecars of one session")
    sidecar_max_store_bytes: Bytes = limit(2 * GiB, "HOPLINE_SIDECAR_MAX_STORE_BYTES",
                                           "the whole sidecar store")
    sidecar_ttl_seconds: Seconds = limit(86400.0, "HOPLINE_SIDECAR_TTL_SECONDS", "sidecar time to live")
    sidecar_reap_interval_seconds: Seconds = limit(3600.0, "HOPLINE_SIDECAR_REAP_INTERVAL_SECONDS",
                                                   "how often the daemon reaps expired sidecars", ge=0.01)
    sidecar_orphan_grace_seconds: Seconds = limit(3600.0, "HOPLINE_SIDECAR_ORPHAN_GRACE_SECONDS",
                                                  "a shared store's sidecar body with no index row is "
                                                  "collected once older than this (younger: another daemon "
                                                  "may be writing it)")
    object_store_timeout_seconds: Seconds = limit(10.0, "HOPLINE_OBJECT_STORE_TIMEOUT",
                                                  "one object-store request (S3: a head, a delete, a list "
                                                  "page, a 1 MiB piece of a download, a 5 MiB part of an "
                                                  "upload), its retries included; then the update goes out "
                                                  "degraded (object_store_unavailable) and a download "
                                                  "answers 503 with Retry-After", ge=0.05, le=600)

    # fixed values: constants, no variable reads them
    range_header_max_chars = fixed(200, Unit.COUNT,
                                   "a sidecar download's Range header (longer: ignored, the whole object is "
                                   "sent)")


class ClusterLimits(HopSettings, hop=HOP_CLUSTER):
    """Several daemons on one store (SPEC X)."""

    owner_lease_seconds: Seconds = limit(10.0, "HOPLINE_OWNER_LEASE_SECONDS",
                                         "a session owner's lease in the store, renewed every third of it; "
                                         "expired, the next write to any daemon adopts the session", le=3600)
    owner_lease_margin: Ratio = limit(1 / 3, "HOPLINE_OWNER_LEASE_MARGIN",
                                      "the part of the lease a daemon keeps in hand: once its last "
                                      "successful renewal (from when it was sent, on its monotonic clock) "
                                      "is older than the lease minus this part of it, it freezes and stops "
                                      "its sessions' agents, before the store can give them to another "
                                      "daemon; a renewal is also given up (its connection closed) after "
                                      "this part of the lease", ge=0.05, le=0.9)
    store_request_deadline_seconds: Seconds = limit(5.0, "HOPLINE_STORE_REQUEST_DEADLINE_SECONDS",
                                                    "a request's wait on the store (any route, a lease or "
                                                    "journal statement, a read): then 503 "
                                                    "storage_unavailable with Retry-After; events already "
                                                    "accepted keep their own retry window "
                                                    "(HOPLINE_STORE_OUTAGE_RETRY_SECONDS)", ge=0.1, le=600)
    cluster_forward_timeout_seconds: Seconds = limit(90.0, "HOPLINE_CLUSTER_FORWARD_TIMEOUT",
                                                     "a write forwarded to its session's owner daemon (then "
                                                     "504)", ge=0.01)
    store_max_connections: Count = limit(4, "HOPLINE_STORE_MAX_CONNECTIONS",
                                         "PostgreSQL connections of one daemon's journal reads (beside its "
                                         "writer, its sidecar index and its LISTEN connection)", le=64)
    store_lock_timeout_seconds: Seconds = limit(1.0, "HOPLINE_STORE_LOCK_TIMEOUT_SECONDS",
                                                "a lease operation waiting on a row lock (PostgreSQL "
                                                "lock_timeout; then 503 and Retry-After: one frozen daemon "
                                                "never freezes another)", ge=0.01, le=600)
    store_statement_timeout_seconds: Seconds = limit(5.0, "HOPLINE_STORE_STATEMENT_TIMEOUT_SECONDS",
                                                     "one lease or heartbeat statement (PostgreSQL "
                                                     "statement_timeout, and the daemon's own deadline on "
                                                     "the answer; then 503 and Retry-After)", ge=0.05, le=600)
    store_outage_retry_seconds: Seconds = limit(30.0, "HOPLINE_STORE_OUTAGE_RETRY_SECONDS",
                                                "a journal commit that failed on a lost connection is "
                                                "retried this long once reconnected (its events wait in the "
                                                "journal queue, which holds the child back); then it is "
                                                "lost, said", ge=0, le=3600)
    store_idle_transaction_seconds: Seconds = limit(5.0, "HOPLINE_STORE_IDLE_TRANSACTION_SECONDS",
                                                    "a journal transaction left idle by its daemon (frozen "
                                                    "mid-commit): PostgreSQL ends it "
                                                    "(idle_in_transaction_session_timeout), its locks go, "
                                                    "another daemon can adopt", ge=0.05, le=3600)
