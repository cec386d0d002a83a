"""The base of every config model (runs, measurement, bench suites): unknown keys are
refused, so a misspelt field in a YAML file is an error naming it, not a setting silently
ignored."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A pydantic model that refuses keys it does not define."""

    model_config = ConfigDict(extra="forbid")
