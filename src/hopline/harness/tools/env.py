"""The environment a tool's command runs with (SPEC D-11): no credential, no setting of hopline's."""

from __future__ import annotations

from collections.abc import Mapping

from hopline.budget import CEILINGS, CREDENTIAL_ENV, HOPLINE_ENV_PREFIX

_CEILING_ENV = frozenset(c.env for c in CEILINGS if c.env)


def tool_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a tool's command runs with: ``environ`` less every credential
    (:data:`CREDENTIAL_ENV`) and every setting of hopline's own (``HOPLINE_*``, the budget's
    variables): where hopline keeps its stores, its tokens and its limits are nothing a tool needs."""
    return {k: v for k, v in environ.items()
            if k not in CREDENTIAL_ENV and not k.startswith(HOPLINE_ENV_PREFIX) and k not in _CEILING_ENV}
