"""How a setting is declared: one typed field of its hop's model.

A hop's model (:class:`HopSettings`, a pydantic-settings model) holds its settings as fields, and a
field is the whole declaration: its variable, default, bounds and description (:func:`limit`, or
:func:`text` for a URL or a token) and its unit (the field's type: :data:`Bytes`, :data:`Count`,
:data:`Tokens`, :data:`Seconds`, :data:`Ratio`). Adding a setting is one field::

    class PipeLimits(HopSettings, hop=HOP_PIPE):
        pipe_max_frame_bytes: Bytes = limit(64 * MiB, <its variable>, <what it bounds>)

A value hopline does not let anyone set is a named constant of its hop's model (:func:`fixed`), not a
field: no variable reads it, and ``hopline limits`` lists it apart.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Generic, Self, TypeVar, cast

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic.fields import FieldInfo

from hopline.budget.ceiling import Ceiling, Unit, parse_size
from hopline.errors import BudgetError

T = TypeVar("T", int, float)


@dataclasses.dataclass(frozen=True)
class _UnitOf:
    """The unit a field's type carries (read back by :func:`ceiling_of`)."""

    unit: Unit


def _size(value: Any) -> Any:
    return parse_size(value) if isinstance(value, str | int) else value


def _whole(value: Any) -> Any:
    if isinstance(value, str):
        if not re.fullmatch(r"-?\d+", value.strip()):
            raise ValueError("not a whole number")
        return int(value.strip())
    return value


def _finite(value: Any) -> Any:
    number = float(value.strip()) if isinstance(value, str) else value
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


# The unit types: a field's type says its unit, and how its variable is parsed (a byte size takes
# hopline's 1024-based units, `10mb`, `8MiB`, `262144`).
Bytes = Annotated[int, _UnitOf(Unit.BYTES), BeforeValidator(_size)]
Count = Annotated[int, _UnitOf(Unit.COUNT), BeforeValidator(_whole)]
Tokens = Annotated[int, _UnitOf(Unit.TOKENS), BeforeValidator(_whole)]
Seconds = Annotated[float, _UnitOf(Unit.SECONDS), BeforeValidator(_finite)]
Ratio = Annotated[float, _UnitOf(Unit.RATIO), BeforeValidator(_finite)]


def limit(default: int | float, env: str, description: str, *, ge: int | float = 1,
          le: int | float | None = None, common: bool = False) -> Any:
    """A ceiling or a time of its hop: read from ``env``, within ``[ge, le]``. ``common``: one of
    the few settings a person sets (the README shows them)."""
    return Field(default, validation_alias=env, ge=ge, le=le, description=description,
                 json_schema_extra={"common": True} if common else None)


def text(env: str, description: str, *, option: str | None = None, secret: bool = False,
         common: bool = False) -> Any:
    """A setting that is a URL or a credential (empty: its default, said in ``description``); never
    in a repr (a URL may carry a password). ``secret``: never shown, ``hopline limits`` says only
    whether it is set."""
    extra: dict[str, Any] = {"option": option, "secret": secret, "common": common}
    return Field("", validation_alias=env, description=description, repr=False, json_schema_extra=extra)


class Fixed(Generic[T]):
    """A fixed value: a named constant of its hop, no setting. ``budget.<key>`` reads it; only code
    (a command's option, a test) may replace it, through :meth:`~hopline.budget.Budget.replace`."""

    def __init__(self, value: T, unit: Unit, description: str, *, ge: int | float = 1,
                 le: int | float | None = None) -> None:
        self.value: T = value
        self.unit = unit
        self.description = description
        self.minimum = ge
        self.maximum = le
        self.key = ""
        self.owner: type[HopSettings] | None = None

    def __set_name__(self, owner: type[HopSettings], name: str) -> None:
        self.key = name
        self.owner = owner

    def __get__(self, instance: HopSettings | None, owner: type[Any] | None = None) -> T:
        if instance is None:
            return self.value
        replaced: T = instance.__pydantic_private__["_fixed"].get(self.key, self.value)  # type: ignore[index]
        return replaced

    @property
    def ceiling(self) -> Ceiling:
        hop = self.owner.hop if self.owner is not None else ""
        return Ceiling(self.key, hop, self.unit, self.value, None, self.description, minimum=self.minimum,
                       maximum=self.maximum)


def fixed(value: T, unit: Unit, description: str, *, ge: int | float = 1,
          le: int | float | None = None) -> Fixed[T]:
    """A fixed value of its hop (see :class:`Fixed`)."""
    return Fixed(value, unit, description, ge=ge, le=le)


class HopSettings(BaseModel):
    """The settings of one hop: each field a setting (see the module), each :func:`fixed` attribute
    a named constant. :meth:`from_env` reads the fields' variables; ``source(key)`` says where a
    value came from.

    A pydantic model, not pydantic-settings' ``BaseSettings``: hopline reads a given mapping (the
    environment a child is handed, a test's), by each field's exact variable, and builds models often
    (``Budget.replace``); ``BaseSettings`` reads ``os.environ`` unless given a source class, and runs
    its sources on every validation (about 40 ms for the budget, against 0.1 ms here). Reading the
    declared variables is one line (:meth:`variables_in`); the types, the bounds, the size parser and
    the coherence rules are pydantic's validation."""

    model_config = ConfigDict(frozen=True, extra="ignore", validate_by_name=True, validate_by_alias=True,
                              ignored_types=(Fixed,))
    hop: ClassVar[str] = ""
    _fixed: dict[str, int | float] = PrivateAttr(default_factory=dict)
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    def __init_subclass__(cls, *, hop: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if hop:
            cls.hop = hop

    def model_post_init(self, context: Any) -> None:
        # Before the model validators run (the coherence rules read fixed values too).
        if isinstance(context, dict):
            self._fixed.update(context.get("fixed", {}))
            self._sources.update(context.get("sources", {}))

    @classmethod
    def variables_in(cls, environ: Mapping[str, str]) -> dict[str, str]:
        """``{variable: value}`` of this model's fields that ``environ`` sets (blank: unset)."""
        names = (f.validation_alias for f in cls.model_fields.values())
        return {name: environ[name] for name in names
                if isinstance(name, str) and environ.get(name, "").strip()}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Every field from its variable in ``environ`` (default: the process environment), unless
        ``overrides`` gives it by key (a command's option); each value's source is recorded. Raises
        :class:`~hopline.errors.BudgetError` naming the variable and the value."""
        env = os.environ if environ is None else environ
        given = cls.variables_in(env)
        key_of = {str(f.validation_alias): key for key, f in cls.model_fields.items()}
        sources = {key_of[name]: name for name in given}
        for key, value in overrides.items():
            given[str(cls.model_fields[key].validation_alias)] = value
            sources[key] = "override"
        try:
            return cls.model_validate(given, context={"sources": sources})
        except ValidationError as exc:
            raise budget_error(exc, cls, given) from None

    def source(self, key: str) -> str:
        """Where the value of ``key`` came from: ``default``, its variable, an option, ``override``."""
        return self._sources.get(key, "default")

    @classmethod
    def fixed_values(cls) -> tuple[Fixed[Any], ...]:
        """The model's fixed values, in declaration order (its bases' first)."""
        seen: dict[str, Fixed[Any]] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if isinstance(value, Fixed):
                    seen[name] = value
        return tuple(seen.values())


def unit_of(field: FieldInfo) -> Unit | None:
    return next((m.unit for m in field.metadata if isinstance(m, _UnitOf)), None)


def ceiling_of(model: type[HopSettings], key: str) -> Ceiling:
    """The :class:`Ceiling` a numeric field declares (its key, hop, unit, default, variable, bounds)."""
    field = model.model_fields[key]
    unit = unit_of(field)
    if unit is None or not isinstance(field.validation_alias, str):
        raise TypeError(f"{model.__name__}.{key} is not a limit (declare it with a unit type and limit())")
    low = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), 1)
    high = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return Ceiling(key, model.hop, unit, field.default, field.validation_alias, field.description or "",
                   minimum=cast(int | float, low), maximum=cast(int | float | None, high),
                   common=bool(extra.get("common")))


def _reason(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if error["type"] == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if error["type"] == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if error["type"] == "value_error":
        return str(ctx.get("error", error["msg"]))
    return str(error["msg"])


def budget_error(exc: ValidationError, model: type[HopSettings], given: Mapping[str, Any]) -> BudgetError:
    """The first bad value as a :class:`BudgetError` naming its variable and the value as given."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "?"
    field = model.model_fields.get(name)
    if field is not None and isinstance(field.validation_alias, str):  # validated by key: name its variable
        shown = given.get(name, error.get("input"))
        name = field.validation_alias
    else:
        shown = given.get(name, error.get("input"))
    return BudgetError(f"{name}={shown!r}: {_reason(error)}")
