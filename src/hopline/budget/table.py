"""The table of every hop's limits, as the hop models declare them (SPEC B): the settings
(:data:`CEILINGS`, each read from its variable) and the fixed values (:data:`FIXED`), each a
:class:`~hopline.budget.ceiling.Ceiling` naming its key, hop, unit, default and bounds. No module
hard-codes a ceiling: they all read a :class:`~hopline.budget.Budget`. A limit that exists only as a
library default is a failure waiting for the right payload, so none is left implicit.
"""

from __future__ import annotations

from collections.abc import Mapping

from hopline.budget.ceiling import Ceiling
from hopline.budget.declare import ceiling_of
from hopline.budget.hops import HOP_MODELS

CEILINGS: tuple[Ceiling, ...] = tuple(ceiling_of(model, key) for model in HOP_MODELS
                                      for key in model.__annotations__ if key in model.model_fields)
FIXED: tuple[Ceiling, ...] = tuple(value.ceiling for model in HOP_MODELS for value in model.fixed_values())
CEILINGS_BY_KEY: Mapping[str, Ceiling] = {c.key: c for c in (*CEILINGS, *FIXED)}

# The byte ceilings one llm-turn request crosses, in order; the narrowest is marked by `limits`.
REQUEST_PATH: tuple[str, ...] = ("transport_max_body_bytes", "api_json_body_limit")

# The client knob of B-5: the only value a client may choose, and only inside this range.
MAX_QUEUED_RANGE: tuple[int, int] = (16, 2048)

# The scripted model's seed hint: any value SQLite and orjson hold exactly (a range, not a cost).
SCRIPTED_SEED_RANGE: tuple[int, int] = (0, 2**63 - 1)
