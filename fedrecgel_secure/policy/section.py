"""The base of every policy section: unknown keys are errors and types are strict."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)
