"""Which children get hopline's per-session credentials (SPEC D-11, T-8).

A credential goes only where it is used: hopline's own agent says in its ``initialize`` answer
(``_meta["hopline.takesCredentials"] = true``) that it takes them, and only a child that said so gets
``_meta["hopline.credentials"]`` in ``session/new`` and ``session/load`` (nothing is minted for the
others). A third-party agent (qwen, Codex, an SDK agent) gets no hopline token in any message, and
never one in its environment (:func:`hopline.daemon.child.child_environment`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hopline.vocabulary import META_TAKES_CREDENTIALS


def takes_credentials(initialized: Mapping[str, Any]) -> bool:
    """True when the child's ``initialize`` answer claims hopline's credentials (exactly ``true``)."""
    meta = initialized.get("_meta")
    return isinstance(meta, Mapping) and meta.get(META_TAKES_CREDENTIALS) is True
