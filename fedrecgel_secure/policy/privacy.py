"""[privacy] and [privacy.audit]: DP, secure aggregation and the canaries of a one-run privacy audit."""

from __future__ import annotations

from pydantic import Field

from fedrecgel_secure.policy.dp import DPSettings
from fedrecgel_secure.policy.secagg import SecureAggregationPolicy
from fedrecgel_secure.policy.section import Section


class AuditPolicy(Section):
    """One-run empirical privacy estimation (Andrew et al., ICLR 2024): canary clients inserted into training."""

    canaries: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Canary clients inserted into training, each Poisson-sampled like a client; as many more are drawn"
        " but never inserted. Each upload is a fixed random direction of norm canary_norm."
        " 0: none (no effect on training).",
    )
    canary_norm: float | None = Field(
        None,
        gt=0,
        description="L2 norm of a canary upload; unset: the DP clip norm (1.0 without DP).",
    )


class PrivacyPolicy(Section):
    dp: DPSettings = Field(default_factory=DPSettings, description="Client-level DP-FedAvg on the shared uploads.")
    secure_aggregation: SecureAggregationPolicy = Field(
        SecureAggregationPolicy(), description="How the server sums the uploads without seeing any one of them."
    )
    audit: AuditPolicy = Field(
        AuditPolicy(),
        description="Audit instrumentation that changes training: canary clients for an empirical epsilon.",
    )
