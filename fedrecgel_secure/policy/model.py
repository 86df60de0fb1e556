"""[model] and [sam]: the NeuMF model and FedRecGEL's sharpness-aware minimisation radii."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fedrecgel_secure.policy.section import Section


class ModelPolicy(Section):
    gmf_dim: int = Field(32, ge=1, description="Width of the GMF user and item embeddings.")
    mlp_dim: int = Field(128, ge=1, description="Width of the MLP user and item embeddings.")
    tower: list[int] = Field([128, 64, 32], min_length=1, description="MLP widths after the 2*mlp_dim input.")
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="Floating-point type of the model and of the clients' embeddings."
    )


class SamPolicy(Section):
    rho_sh: float = Field(0.02, ge=0, description="SAM radius on the shared parameters.")
    rho_ns: float = Field(0.02, ge=0, description="SAM radius on the private (non-shared) parameters.")
