"""[data]: the dataset and how it is split into train, validation and test items."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.section import Section


class DataPolicy(Section):
    dataset: str = Field(
        "filmtrust", description="A registered dataset name (`fedrecgel data list`) or a path to a file."
    )
    path: str | None = Field(
        None, description="The file to read for a non-bundled dataset; overrides the name's default."
    )
    format: str | None = Field(None, description="File format; guessed from the dataset name or file name when absent.")
    min_interactions: int = Field(5, ge=1, description="Users with fewer interactions are dropped.")
    test_negatives: int = Field(99, ge=1, description="Negatives ranked against each held-out item.")
    train_negatives: int = Field(4, ge=1, description="Negatives per training positive, resampled every round.")
    validation: bool = Field(False, description="Hold out the second-latest interaction as a validation item.")
    seed: int = Field(42, description="Seed of the preprocessing: random timestamps and test negatives.")
    cache_dir: str | None = Field(
        None, description="Where prepared splits are cached (default: ~/.cache/fedrecgel-secure)."
    )
    protocol: Literal["authors", "clean"] = Field(
        "clean",
        description="authors: the authors' exact data protocol (their seeded draws, tie rule, per-dataset holdout,"
        " 0/1 training set, training negatives drawn outside the training set only, so the test item can be one,"
        " each positive followed by its own negatives); `fedrecgel data split --protocol authors` writes their files."
        " clean: seeded random holdout, repeated rows trained as often as they occur, and the test item is never"
        " drawn as a training negative (it must not leak into training as a label).",
    )

    @model_validator(mode="after")
    def _authors_has_no_validation(self) -> DataPolicy:
        if self.protocol == "authors" and self.validation:
            raise BadInputError(
                "data.validation = true with data.protocol = 'authors': the authors' protocol holds out the test item"
                " only; use data.protocol = 'clean' for a validation item"
            )
        return self
