"""What the composition root (:mod:`hopline.daemon.app`) builds and the routes are given."""

from __future__ import annotations

import dataclasses
from typing import Any

from hopline.budget import Budget, Settings
from hopline.daemon.bus import EventBus
from hopline.daemon.cluster import Cluster
from hopline.daemon.gates import GateRegistry
from hopline.daemon.sessions.manager import SessionManager
from hopline.observe.pipe import PipeObservability
from hopline.sidecars.expiry import Reaper
from hopline.sidecars.store import SidecarStore
from hopline.store.journal import EventJournal


@dataclasses.dataclass(frozen=True)
class DaemonParts:
    budget: Budget
    settings: Settings
    journal: EventJournal
    bus: EventBus
    manager: SessionManager
    gates: GateRegistry
    instruments: PipeObservability
    store: SidecarStore | None  # the sidecar store, when sidecars are on
    reaper: Reaper | None  # its reaper (expiry), with it
    cluster: Cluster | None  # several daemons on a shared store
    gateway: Any  # the embedded gateway's FastAPI app, or None
