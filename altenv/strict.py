"""The base of every config model (runs, measurement, bench suites): unknown keys are
refused, so a misspelt field in a YAML file is an error naming it, not a setting silently
ignored; ``true``/``false`` where a number belongs is refused too (pydantic would take
``joint: true`` as one trial), and so are ``.inf`` and ``.nan``."""

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _types(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (through ``Optional``, unions, ``Annotated``)."""
    args = get_args(annotation)
    if not args:
        return {annotation}
    return set().union(*(_types(a) for a in args if not isinstance(a, str)))


class Strict(BaseModel):
    """A pydantic model that refuses keys it does not define, and booleans for numbers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            types = _types(cls.model_fields[info.field_name].annotation)
            if types & {int, float} and bool not in types and Any not in types:
                raise ValueError(f"{str(value).lower()} is a boolean; allowed: a number")
        return value
