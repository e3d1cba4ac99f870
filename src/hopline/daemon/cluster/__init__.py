"""Several daemons on one PostgreSQL store (SPEC X): who owns a session, and how the others reach it.

* **Daemons.** Each daemon has a random id per process (a restarted daemon is a new daemon: it owns
  nothing) and a row in ``daemons`` with the URL the others reach it at (``HOPLINE_ADVERTISE_URL``)
  and its last heartbeat.
* **Leases** (:mod:`.leases`, the SQL). A session's agent child lives on one daemon, which holds
  the session's lease (``HOPLINE_OWNER_LEASE_SECONDS``, store time, renewed every third of it by
  the heartbeat). A lease is taken by one compare-and-set transaction (``try_adopt``), so of two
  daemons racing for a session exactly one wins. The heartbeat tells which leases this daemon still
  holds: a daemon that finds a lease taken (it was paused or partitioned away) stops its children
  for those sessions.
* **No cascades.** The lease operations and the heartbeat each run on their own connection
  (:class:`~hopline.store.bounded.BoundedConnection`: ``lock_timeout``, ``statement_timeout`` and a
  deadline of its own on every answer), never behind the journal's. A lease row a commit holds
  (the old owner's fencing read, perhaps frozen mid-transaction) is never waited on: the adoption
  answers :class:`~hopline.store.bounded.StoreBusy` (503 and ``Retry-After``) until PostgreSQL ends
  that idle transaction (``HOPLINE_STORE_IDLE_TRANSACTION_SECONDS``). So a frozen daemon stalls
  only its own sessions: the others keep their heartbeat, their leases and their status.
* **Writes go to the owner** (:mod:`.forward`): forwarded over HTTP with the cluster credential,
  which :mod:`.auth` checks on the receiving daemon; the owner's answer is the client's answer.
* **Readers everywhere** (:mod:`.membership`, with the heartbeat): one ``LISTEN hopline_events``
  connection per daemon wakes this daemon's readers of a session, who read the rows from the journal.
* **Metrics** (:mod:`.gauges`, ``prometheus_client`` collectors): this daemon's series labelled with
  its id, and the cluster's totals.

The names other modules use are re-exported here; the modules of this package import each other,
never this one (no import circle).
"""

from hopline.daemon.cluster.auth import FORWARDED_SCOPE_KEY, ClusterAuth
from hopline.daemon.cluster.gauges import ClusterGauges, DaemonLabelled
from hopline.daemon.cluster.leases import Owner, new_daemon_id
from hopline.daemon.cluster.membership import Cluster

__all__ = ["FORWARDED_SCOPE_KEY", "Cluster", "ClusterAuth", "ClusterGauges", "DaemonLabelled", "Owner",
           "new_daemon_id"]
