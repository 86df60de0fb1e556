"""The whole policy: every section, the checks that span sections, and the digest a checkpoint resumes under."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

import tomli_w
from pydantic import Field, model_validator

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.data import DataPolicy
from fedrecgel_secure.policy.deployment import DeploymentPolicy
from fedrecgel_secure.policy.federation import CheckpointPolicy, EvaluationPolicy, FederationPolicy
from fedrecgel_secure.policy.model import ModelPolicy, SamPolicy
from fedrecgel_secure.policy.privacy import AuditPolicy, PrivacyPolicy
from fedrecgel_secure.policy.secagg import SecureAggregationPolicy
from fedrecgel_secure.policy.section import Section
from fedrecgel_secure.policy.tracking import TrackingPolicy
from fedrecgel_secure.scheme_facts import FACTS, NORM_CHECK_GRID_BITS, facts_of

Method = Literal["fedrecgel", "fedncf", "sam-shared", "sam-private"]


class Policy(Section):
    method: Method = Field("fedrecgel", description="fedncf: no SAM; sam-shared / sam-private: SAM on one group only.")
    seed: int = Field(42, description="Seed of training: model init, client sampling, negatives.")
    data: DataPolicy = Field(
        DataPolicy(), description="The dataset and how it is split into train, validation and test items."
    )
    model: ModelPolicy = Field(ModelPolicy(), description="The NeuMF model: embedding widths, MLP tower, dtype.")
    federation: FederationPolicy = Field(
        FederationPolicy(), description="Rounds, client sampling, learning rates and the training engine."
    )
    sam: SamPolicy = Field(SamPolicy(), description="Sharpness-aware minimisation radii of FedRecGEL.")
    evaluation: EvaluationPolicy = Field(
        EvaluationPolicy(), description="When to evaluate, and which metric selects the best round."
    )
    checkpoint: CheckpointPolicy = Field(
        CheckpointPolicy(), description="How often the run is saved to continue after a crash."
    )
    privacy: PrivacyPolicy = Field(
        PrivacyPolicy(), description="Client-level differential privacy and secure aggregation."
    )
    deployment: DeploymentPolicy = Field(
        DeploymentPolicy(),
        description="Separate processes on Flower: SuperLink, nodes, sharding, timeouts (fedrecgel deploy).",
    )
    tracking: TrackingPolicy = Field(
        TrackingPolicy(), description="Experiment trackers the run's records also go to: TensorBoard, MLflow."
    )

    @model_validator(mode="after")
    def _tower_fits(self) -> Policy:
        if any(w < 1 for w in self.model.tower):
            raise ValueError("model.tower widths must be >= 1")
        return self

    @model_validator(mode="after")
    def _clipped_bit_is_covered(self) -> Policy:
        dp, secagg = self.privacy.dp, self.privacy.secure_aggregation
        sealed = facts_of(secagg.scheme).sealed
        if dp.enabled and dp.adaptive_clipping is not None and sealed and secagg.cover != "shared":
            raise BadInputError(
                "privacy.dp.adaptive_clipping with privacy.secure_aggregation.cover = 'item_embeddings': each client's"
                " clipped bit travels with its upload and would be summed outside the protocol, where the server"
                " sees it; use cover = 'shared'"
            )
        return self

    @model_validator(mode="after")
    def _radii_the_method_uses(self) -> Policy:
        """The resolved policy states the SAM radii that run: 0 for a group the method trains without SAM
        (fedncf: both), whatever [sam] says, so ``policy.resolved.toml`` never shows a radius that is not used."""
        rho_sh, rho_ns = self.rhos()
        if (rho_sh, rho_ns) != (self.sam.rho_sh, self.sam.rho_ns):
            self.sam = SamPolicy(rho_sh=rho_sh, rho_ns=rho_ns)
        return self

    @model_validator(mode="after")
    def _dp_observers_need_secure_sums(self) -> Policy:
        dp, scheme = self.privacy.dp, facts_of(self.privacy.secure_aggregation.scheme)
        if dp.enabled and dp.shares == "threshold" and (dp.mode != "distributed" or not scheme.threshold_shares):
            raise BadInputError(
                "privacy.dp.shares = 'threshold' sizes distributed noise shares for the masking protocol's survivor"
                " threshold: it needs mode = 'distributed' and privacy.secure_aggregation.scheme = 'masking'"
            )
        if dp.enabled and dp.mode == "distributed" and not scheme.noise_shares:
            raise BadInputError(
                "privacy.dp.mode = 'distributed' with privacy.secure_aggregation.scheme = 'dpf': a client's noise"
                " share is dense and would touch every row the scheme keeps sparse; use mode = 'central' (the key"
                " holder adds the noise, which the aggregator never learns)"
            )
        summed = dp.enabled and dp.simulate_shares == "summed"
        if summed and scheme.sealed and self.privacy.secure_aggregation.simulation != "arithmetic":
            raise BadInputError(
                "privacy.dp.simulate_shares = 'summed' with privacy.secure_aggregation.simulation = 'protocol': the"
                " protocol's clients each draw their own share; set simulation = 'arithmetic' (the same sum without"
                " cryptography) or simulate_shares = 'per_client'"
            )
        server_bound = (dp.mode == "distributed" and scheme.sealed) or dp.participation == "hidden"
        if dp.enabled and dp.max_epsilon_against == "server" and not server_bound:
            raise BadInputError(
                "privacy.dp.max_epsilon_against = 'server' bounds what the server learns from the noisy sums: it"
                " needs mode = 'distributed' and a secure aggregation scheme (without one the server sees each upload),"
                " or participation = 'hidden'"
            )
        noise_hidden = (dp.mode == "central" and scheme.key_holder) or (dp.mode == "distributed" and scheme.sealed)
        if dp.enabled and dp.participation == "hidden" and not noise_hidden:
            raise BadInputError(
                "privacy.dp.participation = 'hidden' needs noise that no party sizes from who took part, and that the"
                " server never sees without: mode = 'central' with privacy.secure_aggregation.scheme = 'bfv' or 'dpf'"
                " (the key holder adds it), or mode = 'distributed' with 'masking' or 'bfv' (every user adds its"
                f" share); got mode = {dp.mode!r}, scheme = {self.privacy.secure_aggregation.scheme!r}"
            )
        return self

    @model_validator(mode="after")
    def _norm_check_grid(self) -> Policy:
        """The DPF norm check's bound C · 2^f must fit Field64 (:data:`NORM_CHECK_GRID_BITS`): frac_bits defaults
        to the finest grid that does, and a finer one asked for is refused."""
        dp, secagg = self.privacy.dp, self.privacy.secure_aggregation
        if not (dp.enabled and facts_of(secagg.scheme).norm_check and secagg.dpf.norm_check):
            return self
        where = "privacy.secure_aggregation.dpf.norm_check"
        if dp.adaptive_clipping is not None:
            raise BadInputError(
                f"{where} with privacy.dp.adaptive_clipping: the bound each upload proves would move every round; use"
                f" a fixed privacy.dp.clip_norm, or set {where} = false"
            )
        if secagg.dpf.value_bits != 64:
            raise BadInputError(
                f"{where} needs privacy.secure_aggregation.dpf.value_bits = 64: the proof is in Field64"
            )
        # the bound covers the update (norm ≤ C) and any metrics a round's users report inside the sum (each in
        # [0, 1]): at most len(report_keys) of them, where evaluation.scope may resolve to "round"
        reports = 0 if self.evaluation.scope == "all" else len(self.report_keys())
        finest = math.floor(NORM_CHECK_GRID_BITS - math.log2(math.hypot(dp.clip_norm, math.sqrt(reports))))
        if "frac_bits" not in secagg.model_fields_set:
            secagg.frac_bits = min(secagg.frac_bits, finest)
        elif secagg.frac_bits > finest:
            raise BadInputError(
                f"{where}: privacy.secure_aggregation.frac_bits {secagg.frac_bits} puts the clip norm"
                f" {dp.clip_norm} (with {reports} reported metrics) past what Field64's squares hold on the grid; set"
                f" frac_bits to {finest} or less, or {where} = false"
            )
        return self

    def report_keys(self) -> list[str]:
        """The metrics each user reports inside the sum under evaluation.scope "round", in coordinate order."""
        k = self.evaluation.select_by.split("@")[1]
        keys = [f"hr@{k}", f"ndcg@{k}"]
        return keys + ([f"val_{m}" for m in keys] if self.data.validation else [])

    def rhos(self) -> tuple[float, float]:
        """(rho_sh, rho_ns) in effect for the method (also after a ``model_copy`` that changed the method)."""
        rho_sh = self.sam.rho_sh if self.method in ("fedrecgel", "sam-shared") else 0.0
        rho_ns = self.sam.rho_ns if self.method in ("fedrecgel", "sam-private") else 0.0
        return rho_sh, rho_ns

    def to_toml(self) -> str:
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))

    def digest(self) -> str:
        """SHA-256 of the resolved policy's canonical JSON, less what does not change the computation; a checkpoint
        only resumes under the same digest.

        Left out: ``[deployment]`` and ``[tracking]``, ``simulation`` and ``workers`` (how the exact sum is
        computed), ``dpf.device`` (where) and ``federation.threads`` (how many), and settings still at the value
        that predates them (``[privacy.audit]`` without canaries, ``tampered = 0``, ``bfv.max_refusals = 3``,
        a scheme section newer than masking's and BFV's (``dpf``) at its defaults, ``evaluation.scope`` unset,
        ``dp.evaluation_share = 0.1``, ``dp.simulate_shares = "per_client"``), so runs started before they existed
        keep their digest."""
        # [deployment] says where the roles run and [tracking] where records are logged, not what is computed: a
        # run may move machines or trackers and still resume
        dump = self.model_dump(mode="json", exclude={"deployment", "tracking"})
        if (
            self.privacy.audit == AuditPolicy()
        ):  # no canaries: the digest of runs started before [privacy.audit] existed
            del dump["privacy"]["audit"]
        secagg = dump["privacy"]["secure_aggregation"]
        # how the sum is computed (all exact, equal by test), not what: a run may resume in another mode
        del secagg["simulation"], secagg["workers"]
        if secagg["tampered"] == 0:  # the digest of runs started before the setting existed
            del secagg["tampered"]
        if secagg["bfv"]["max_refusals"] == 3:  # likewise (the key holder's limit of refusals)
            del secagg["bfv"]["max_refusals"]
        del secagg["dpf"]["device"]  # where the servers expand keys (the same bits): not what is computed
        # a scheme's section that came after the first digests counts only where it differs from its defaults, so
        # adding a scheme keeps every earlier run's digest (masking's and BFV's were always there)
        defaults = SecureAggregationPolicy().model_dump(mode="json")
        for name in FACTS:
            if name not in ("masking", "bfv") and isinstance(secagg.get(name), dict):
                default = {k: v for k, v in defaults[name].items() if k in secagg[name]}
                if secagg[name] == default:
                    del secagg[name]
        if dump["evaluation"]["scope"] is None:  # likewise
            del dump["evaluation"]["scope"]
        if not dump["evaluation"]["full_ranking"]:  # likewise
            del dump["evaluation"]["full_ranking"]
        if dump["federation"]["server_optimizer"] == "adam":  # likewise
            del dump["federation"]["server_optimizer"]
        # how many threads compute it (the last bits of a sum may differ, as between machines before the setting
        # existed), not what: a run may resume with another count, and runs started before it keep their digest
        del dump["federation"]["threads"]
        defaults = (("max_epsilon_against", "release"), ("shares", "sampled"), ("evaluation_share", 0.1))
        defaults += (("simulate_shares", "per_client"),)
        for field, default in (*defaults, ("correlation", "independent")):
            if dump["privacy"]["dp"][field] == default:
                del dump["privacy"]["dp"][field]
        canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def refuses_to_continue(self, digest: str | None, planned_rounds: int | None) -> str | None:
        """Why a run written under ``digest``, planning ``planned_rounds``, cannot continue under this policy, or
        None: a run continues under the policy it was written with, except for the number of rounds, which may
        change unless the DP noise was calibrated for the rounds it planned."""
        if digest == self.digest():
            return None
        if planned_rounds is not None:
            federation = self.federation.model_copy(update={"rounds": int(planned_rounds)})
            if digest == self.model_copy(update={"federation": federation}).digest():
                dp = self.privacy.dp
                if not (dp.enabled and dp.noise_multiplier is None):
                    return None
                return (
                    f"federation.rounds cannot change from {planned_rounds} to {self.federation.rounds}: the DP"
                    " noise was calibrated to privacy.dp.target_epsilon over the planned rounds"
                )
        return "was written under a different policy (only federation.rounds may change)"
