"""[privacy.dp]: client-level DP-FedAvg settings; the maths that uses them is :mod:`fedrecgel_secure.privacy.dp`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from fedrecgel_secure.checks import FIELD as DP
from fedrecgel_secure.checks import fractions_sum_to_one, open_unit, positive
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.section import Section

Mode = Literal["central", "distributed"]
AccountantKind = Literal["pld", "rdp", "prv", "gdp"]
NoiseSource = Literal["secure", "seeded"]


class AdaptiveClippingSettings(Section):
    """[privacy.dp.adaptive_clipping]: Andrew et al. 2021; the defaults are the paper's."""

    initial: float = Field(0.1, description="Clip norm of the first round (replaces privacy.dp.clip_norm).")
    target_quantile: float = Field(0.5, description="Fraction of uploads meant to be left unclipped, in (0, 1).")
    learning_rate: float = Field(
        0.2, description="Geometric rate: C changes by at most a factor exp(learning_rate) per round."
    )
    clipped_count_stddev: float | None = Field(
        None, description="Absolute std of the noise on the clipped count; unset means m/20."
    )

    @field_validator("initial", "learning_rate")
    @classmethod
    def _validate_positive(cls, value: float, info) -> float:
        return positive(value, f"{DP}.adaptive_clipping.{info.field_name}")

    @field_validator("target_quantile")
    @classmethod
    def _validate_quantile(cls, value: float) -> float:
        return open_unit(value, f"{DP}.adaptive_clipping.target_quantile")

    @field_validator("clipped_count_stddev")
    @classmethod
    def _validate_count_std(cls, value: float | None) -> float | None:
        return None if value is None else positive(value, f"{DP}.adaptive_clipping.clipped_count_stddev")


class GroupFractions(Section):
    """[privacy.dp.group_fractions]: share f_g of the squared clip budget per parameter group."""

    item_embeddings: float = Field(0.5, description="Share of C^2 for the item embedding tables.")
    mlp: float = Field(0.5, description="Share of C^2 for the MLP tower and the prediction layer.")

    @model_validator(mode="after")
    def _sums_to_one(self) -> GroupFractions:
        fractions_sum_to_one(self.model_dump())
        return self


class DPSettings(Section):
    """[privacy.dp]: client-level DP-FedAvg (McMahan et al. 2018) on the shared uploads."""

    enabled: bool = Field(False, description="Turn client-level DP on.")
    mode: Mode = Field(
        "central",
        description="central: the server adds the noise to the sum; distributed: each client adds its share before"
        " secure aggregation, so no party sees a noiseless sum.",
    )
    noise: NoiseSource = Field(
        "secure",
        description="Where the client sample and the noise come from. secure: a CSPRNG keyed by a secret drawn at run"
        " start and kept only in the 0600 checkpoint. seeded: derived from the policy seed, reproducible for studies,"
        " and NO guarantee against anyone who has the policy file.",
    )
    clip_norm: float = Field(
        1.0, description="L2 clip norm C of each upload (with adaptive clipping: adaptive_clipping.initial)."
    )
    noise_multiplier: float | None = Field(
        None, description="z: noise std z*C on the sum. Exactly one of this and target_epsilon."
    )
    target_epsilon: float | None = Field(
        None, description="Epsilon to reach after the planned rounds; z is calibrated from it."
    )
    delta: float = Field(1e-5, description="The delta of (epsilon, delta)-DP; must be below 1/number of clients.")
    max_epsilon: float | None = Field(None, description="Stop before any round that would bring epsilon above this.")
    max_epsilon_against: Literal["release", "server"] = Field(
        "release",
        description="Whose epsilon max_epsilon bounds. release: anyone who sees the released models (the accounted"
        " epsilon). server: the server in distributed mode, which sees who took part (no amplification by sampling).",
    )
    accountant: AccountantKind = Field(
        "pld",
        description="pld: privacy loss distributions (Google's dp-accounting, tightest); rdp, prv: Opacus's"
        " (RDP is always reported beside as a cross-check); gdp: an approximation, not a bound.",
    )
    shares: Literal["sampled", "threshold"] = Field(
        "sampled",
        description="Distributed noise shares sized for everyone sampled (a dropout lowers the noise), or for the"
        " masking protocol's survivor threshold (any round that completes carries at least the planned noise).",
    )
    simulate_shares: Literal["per_client", "summed"] = Field(
        "per_client",
        description="How a simulation draws distributed noise. per_client: each client its own share, as the"
        " protocol does (the released sum bit for bit). summed: a STUDY MODE: the contributors' shares drawn as one"
        " Gaussian of their summed variance, the same distribution but not the protocol's bits (the per-client"
        " rounding onto the grid is one rounding), several times faster; every record and summary says so. Only"
        " in simulation, with secure aggregation simulated as 'arithmetic'; a deployment refuses it.",
    )
    sample_rate: float | None = Field(None, description="Poisson sampling rate q; unset uses federation.fraction.")
    sampler: Literal["poisson", "cyclic", "fixed"] = Field(
        "poisson",
        description="Client sampling. poisson: each client independently with rate q; epsilon is amplified by the"
        " sampling, which holds against whoever sees only the released models, not against the server, which knows"
        " who took part. cyclic: a secret random permutation puts each client in one of b = round(1/q) slots, slot s"
        " trains in rounds s+1, s+1+b, ...: every client at most ceil(rounds/b) times, b rounds apart (a deployment's"
        " nodes enforce both), and epsilon, with no amplification, holds against the server too. fixed: not with DP.",
    )
    participation: Literal["known", "hidden"] = Field(
        "known",
        description="Who knows which users took part in a round. known: the server draws the sample and sends the"
        " train message to the sampled users only, so amplification by sampling holds against the release, not"
        " against the server. hidden: each user's node draws the user's participation from its own secret (Poisson"
        " at rate q), every node answers every round with a reply of one shape, and a user not drawn adds zeros"
        " inside the secure sum: amplification holds against the server too, and epsilon against the server is"
        " epsilon against the release (zero-out adjacency). Needs sampler = 'poisson' and secure aggregation with"
        " noise the server never sees without: mode = 'central' under a key holder (bfv, dpf), or 'distributed'"
        " (masking, bfv), where every user adds its share, sized for N.",
    )
    evaluation_share: float = Field(
        0.1,
        description="Under evaluation.scope = 'round': the share s of each round's privacy (1/z^2) spent on the"
        " metrics its users report inside the sum. The updates get noise multiplier z/sqrt(1-s), the metrics"
        " z/sqrt(s) on their sensitivity sqrt(number of metrics); the round stays one Gaussian mechanism of z.",
    )
    correlation: Literal["independent", "banded"] = Field(
        "independent",
        description="The noise across rounds. independent: a fresh draw each round. banded: BandMF (Choquette-Choo"
        " et al. 2023), round t adds (C^-1 z)_t for a banded Toeplitz C of b bands (b = the cyclic period) with unit"
        " column norm, optimised for the prefix sums; the same epsilon as independent noise under cyclic"
        " participation, less error in the model. Needs sampler = 'cyclic' and mode = 'central' (under BFV the key"
        " holder keeps the noise state, and epsilon holds against the server too).",
    )
    per_group_clipping: bool = Field(
        False, description="Clip the item table and the MLP separately, the budget split by group_fractions."
    )
    group_fractions: GroupFractions = Field(
        default_factory=GroupFractions, description="Split of C^2 between the groups."
    )
    adaptive_clipping: AdaptiveClippingSettings | None = Field(
        None, description="Tune C to a quantile of the upload norms."
    )

    @field_validator("clip_norm", "noise_multiplier", "target_epsilon", "max_epsilon")
    @classmethod
    def _validate_positive(cls, value: float | None, info) -> float | None:
        return None if value is None else positive(value, f"{DP}.{info.field_name}")

    @field_validator("delta")
    @classmethod
    def _validate_delta(cls, value: float) -> float:
        return open_unit(value, f"{DP}.delta")

    @field_validator("evaluation_share")
    @classmethod
    def _validate_share(cls, value: float) -> float:
        return open_unit(value, f"{DP}.evaluation_share")

    @field_validator("sample_rate")
    @classmethod
    def _validate_sample_rate(cls, value: float | None) -> float | None:
        return None if value is None else open_unit(value, f"{DP}.sample_rate", closed_right=True)

    @model_validator(mode="after")
    def _consistent(self) -> DPSettings:
        if not self.enabled:
            return self
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise BadInputError(
                f"{DP}: set exactly one of {DP}.noise_multiplier and {DP}.target_epsilon when DP is enabled"
            )
        if self.correlation == "banded" and (self.sampler != "cyclic" or self.mode != "central"):
            raise BadInputError(
                f"{DP}.correlation = 'banded' needs {DP}.sampler = 'cyclic' (its sensitivity, sqrt(k) times the clip"
                f" norm, holds for rounds b apart) and {DP}.mode = 'central' (one party keeps the noise state); got"
                f" sampler = {self.sampler!r}, mode = {self.mode!r}"
            )
        if self.simulate_shares == "summed" and self.mode != "distributed":
            raise BadInputError(
                f"{DP}.simulate_shares = 'summed' draws distributed noise shares as one: it needs {DP}.mode ="
                f" 'distributed', got {self.mode!r}"
            )
        if self.participation == "hidden" and self.sampler != "poisson":
            raise BadInputError(
                f"{DP}.participation = 'hidden' has each node draw its users' Poisson sample: it needs {DP}.sampler ="
                f" 'poisson', got {self.sampler!r}"
            )
        if self.participation == "hidden" and self.adaptive_clipping is not None:
            raise BadInputError(
                f"{DP}.participation = 'hidden' with {DP}.adaptive_clipping: every user answers every round, and a"
                " user who was not drawn would add its clipped bit to the count; use a fixed clip_norm"
            )
        if self.sampler == "fixed":
            raise BadInputError(
                f"{DP}.sampler = 'fixed' cannot be used with DP: the accountants' amplification by"
                " sampling assumes each client is included independently (Poisson sampling); use 'poisson',"
                " or 'cyclic' (bounded participation, no amplification)"
            )
        return self
