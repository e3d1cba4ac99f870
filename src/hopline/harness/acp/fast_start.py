"""A fast start for `hopline agent` (SPEC D-9): a warm pool refills only as fast as a child starts.

Profiled (`python -X importtime`), 0.36 s of the agent's 0.47 s start went to importing the ACP SDK's
``acp.schema``: 280 pydantic models built at import. Two parts of that work buy the agent nothing:

- the attribute docstrings pydantic reads from each model's source (the SDK's
  ``use_attribute_docstrings``): they only become ``description`` in a JSON Schema, which the
  agent never renders;
- the eager schema build: with ``defer_build`` a model is built the first time it validates or
  serializes, so only the models the agent uses are built, and they behave the same.

Together they take the start to about 0.3 s. Both must be in place before ``acp`` is imported, so
:func:`skip_unused_model_work` runs first in the agent's entry point, and nowhere else: the
daemon and the gate keep pydantic as it is. Each step is taken only where this pydantic has it.
"""

from __future__ import annotations

from typing import Any


def skip_unused_model_work() -> bool:
    """Make pydantic skip the two; returns whether the docstring step was found (pydantic moved it
    in a version we do not know: the start is then slower, never wrong)."""
    import pydantic
    from pydantic._internal import _fields

    # Merged into every model's config (pydantic reads each base's ``model_config``); a model that
    # sets it itself keeps its own.
    pydantic.BaseModel.model_config["defer_build"] = True
    if not callable(getattr(_fields, "_update_fields_from_docstrings", None)):
        return False

    def no_docstrings(cls: type[Any], fields: dict[str, Any], use_inspect: bool = False) -> None:
        return None

    _fields._update_fields_from_docstrings = no_docstrings
    return True
