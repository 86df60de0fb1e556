"""Policy files: one pydantic model tree, read from TOML, the single source of truth for a run.

Unknown keys are errors and types are strict. Every error names the file, the
dotted field path and what was expected.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.dp.checks import FIELD as DP
from fedrecgel_secure.privacy.dp.checks import fractions_sum_to_one, open_unit, positive

_HERE = Path(__file__).resolve().parent
# Ready policies: installed as package data next to this file, or the top-level
# policies/ folder of a source checkout (editable install).
POLICY_DIR = _HERE / "policies" if (_HERE / "policies").is_dir() else _HERE.parent / "policies"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


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


class ModelPolicy(Section):
    gmf_dim: int = Field(32, ge=1, description="Width of the GMF user and item embeddings.")
    mlp_dim: int = Field(128, ge=1, description="Width of the MLP user and item embeddings.")
    tower: list[int] = Field([128, 64, 32], min_length=1, description="MLP widths after the 2*mlp_dim input.")
    dtype: Literal["float32", "float64"] = Field(
        "float32", description="Floating-point type of the model and of the clients' embeddings."
    )


class FederationPolicy(Section):
    rounds: int = Field(
        100, ge=1, description="Training rounds; each samples clients, aggregates their uploads and steps the server."
    )
    fraction: float = Field(0.1, gt=0, le=1, description="Fraction of clients sampled per round.")
    server_lr: float = Field(0.001, gt=0, description="Server Adam learning rate on the shared parameters.")
    client_lr: float = Field(0.1, gt=0, description="Client Adam learning rate on the private user embedding.")
    chunk_size: int = Field(128, ge=1, description="Chunk length of the sum-of-chunk-means loss.")
    engine: Literal["batched", "per-client"] = Field("batched", description="per-client is the plain reference path.")
    clients_per_batch: int = Field(256, ge=1, description="Batched engine: clients trained together, bounds memory.")


class SamPolicy(Section):
    rho_sh: float = Field(0.02, ge=0, description="SAM radius on the shared parameters.")
    rho_ns: float = Field(0.02, ge=0, description="SAM radius on the private (non-shared) parameters.")


class EvaluationPolicy(Section):
    every: int = Field(1, ge=1, description="Evaluate every this many rounds (and after the last).")
    select_by: Literal["hr@5", "hr@10", "hr@15", "hr@20", "ndcg@5", "ndcg@10", "ndcg@15", "ndcg@20"] = Field(
        "hr@10",
        description="The metric that picks the summary's best round (on the test items) and validation-selected round.",
    )


class CheckpointPolicy(Section):
    every: int = Field(10, ge=1, description="Write a checkpoint every this many rounds (and after the last).")


# --------------------------------------------------------------------------- [privacy.dp]

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
    sample_rate: float | None = Field(None, description="Poisson sampling rate q; unset uses federation.fraction.")
    sampler: Literal["poisson", "fixed"] = Field("poisson", description="Client sampling; DP requires poisson.")
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
        if self.sampler == "fixed":
            raise BadInputError(
                f"{DP}.sampler = 'fixed' cannot be used with DP: the accountants' amplification by"
                " sampling assumes each client is included independently (Poisson sampling); use 'poisson'"
            )
        return self


# --------------------------------------------------------------------------- [privacy.secure_aggregation]


class BfvPolicy(Section):
    """TenSEAL BFV (exact) for addition only, 128-bit security; sums the fixed-point grid integers mod a prime t."""

    poly_modulus_degree: int = Field(8192, description="Ring degree N; a ciphertext packs N grid values.")
    coeff_mod_bit_sizes: list[int] = Field(
        [60, 60, 60],
        description="Prime chain (the last is SEAL's key-switching prime); its sum is capped by N at 128-bit security.",
    )
    plain_modulus_bits: int = Field(
        59,
        ge=20,
        le=59,
        description="Bits of the plain modulus t, a prime = 1 mod 2N; sums must stay below t/2 (checked at start).",
    )

    def params(self):
        from fedrecgel_secure.privacy.secagg import BFVParams

        return BFVParams(
            poly_modulus_degree=self.poly_modulus_degree,
            coeff_mod_bit_sizes=tuple(self.coeff_mod_bit_sizes),
            plain_modulus_bits=self.plain_modulus_bits,
        )


class MaskingPolicy(Section):
    """Pairwise masking (Bonawitz et al. 2017) on a SecAgg+ neighbour graph (Bell et al. 2020)."""

    degree: int | Literal["all", "secagg+", "auto"] = Field(
        "auto",
        description="Neighbours per client: all pairs, SecAgg+'s 2*ceil(log2 n),"
        " or auto (all pairs for small cohorts).",
    )
    threshold: int | float | None = Field(
        None, description="Shamir threshold t: a count, or a fraction of the neighbours."
    )
    consistency: float = Field(
        2 / 3,
        ge=0.5,
        lt=1,
        description="Consistency check f (malicious server): a client releases shares only after floor(f*n)+1"
        " of the n clients in the cohort signed the same survivor set;"
        " at most n minus that many may drop out after masking.",
    )

    def params(self):
        from fedrecgel_secure.privacy.secagg import MaskingParams

        return MaskingParams(degree=self.degree, threshold=self.threshold, consistency=self.consistency)


class SecureAggregationPolicy(Section):
    scheme: Literal["none", "bfv", "masking"] = Field(
        "none",
        description="How uploads are summed; none: in the clear; bfv: exact homomorphic encryption;"
        " masking: pairwise masks.",
    )
    min_clients: int = Field(2, ge=1, description="The server learns a sum only of at least this many valid uploads.")
    cover: Literal["shared", "item_embeddings"] = Field(
        "shared", description="What goes through the protocol: the whole shared vector, or the item table alone."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Simulated fraction of clients that go silent after masking.")
    tampered: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Simulated fraction of the other clients whose upload is altered in transit;"
        " the aggregator refuses it and the round goes on without them.",
    )
    simulation: Literal["protocol", "arithmetic"] = Field(
        "protocol",
        description="How a simulated run computes the secure sum; protocol: every role runs the real cryptography"
        " and the run reports its cost; arithmetic: the exact sum the protocol would release (same grid, same"
        " dropouts, refusals and skipped rounds), without cryptography, for fast studies.",
    )
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="Processes that run the simulated clients' cryptography in protocol mode;"
        " auto: one per CPU core; 1: all roles in the training process.",
    )
    clip_range: float = Field(
        32.0,
        gt=0,
        description="Fixed-point range R: each value a client hands over is clipped to [-R, R]"
        " (clipped values are counted in metrics.jsonl).",
    )
    frac_bits: int = Field(
        36, ge=0, le=52, description="Fixed-point precision: values are rounded to multiples of 2^-frac_bits."
    )
    bfv: BfvPolicy = Field(BfvPolicy(), description='TenSEAL BFV parameters, used when scheme = "bfv".')
    masking: MaskingPolicy = Field(
        MaskingPolicy(), description='Pairwise-masking parameters, used when scheme = "masking".'
    )

    @model_validator(mode="before")
    @classmethod
    def _no_ckks(cls, data: Any) -> Any:
        if isinstance(data, dict) and (data.get("scheme") == "ckks" or "ckks" in data):
            field = 'scheme = "ckks"' if data.get("scheme") == "ckks" else "[privacy.secure_aggregation.ckks]"
            raise BadInputError(
                f"privacy.secure_aggregation: {field} is no longer supported: approximate CKKS decryptions let"
                " whoever receives them solve for the secret key and decrypt single uploads (Li and Micciancio,"
                ' Eurocrypt 2021); use scheme = "bfv" (exact, same fixed-point grid) or "masking"'
            )
        return data

    def worker_count(self) -> int:
        """The worker processes protocol mode uses (``workers``, with auto resolved to this machine's cores)."""
        if self.workers != "auto":
            return self.workers
        try:
            return len(os.sched_getaffinity(0))  # the cores this process may run on
        except AttributeError:  # not Linux
            return os.cpu_count() or 1

    def encoding(self):
        from fedrecgel_secure.privacy.secagg import FixedPoint

        return FixedPoint(clip_range=self.clip_range, frac_bits=self.frac_bits)


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


# --------------------------------------------------------------------------- [deployment]

DEPLOY = "deployment"
IdentityKey = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
"""A node's Ed25519 identity public key, 64 lowercase hex digits (``fedrecgel deploy identity`` prints it)."""


class SuperLinkPolicy(Section):
    """[deployment.superlink]: where the Flower SuperLink listens (fedrecgel deploy)."""

    host: str = Field("127.0.0.1", description="Address the SuperLink binds and the SuperNodes dial.")
    port: int = Field(
        9091,
        ge=1,
        le=65535,
        description="flwr 1.42 serves its Fleet, Runtime (ServerApp) and Control (flwr run) APIs on this one HTTP port;"
        " the Control API has no authentication in this build, so only the nodes and the operator may reach it"
        " (firewall).",
    )


class TlsPolicy(Section):
    """[deployment.tls]: certificates of the SuperLink and node authentication."""

    enabled: bool = Field(
        False, description="Serve the SuperLink over TLS; false runs with --insecure (one trusted machine only)."
    )
    ca_cert: str | None = Field(
        None,
        description="PEM file of the CA that signed the SuperLink certificate (given to every SuperNode);"
        " with none of the three files, deploy local makes a throwaway CA and certificate for 127.0.0.1.",
    )
    server_cert: str | None = Field(None, description="PEM file of the SuperLink certificate.")
    server_key: str | None = Field(None, description="PEM file of the SuperLink private key.")
    node_authentication: bool = Field(
        False,
        description="Only SuperNodes whose public keys are registered with the SuperLink may connect"
        " (flwr supernode register); each node makes its own ECDSA P-384 key.",
    )

    @model_validator(mode="after")
    def _complete(self) -> TlsPolicy:
        files = ("ca_cert", "server_cert", "server_key")
        given = [k for k in files if getattr(self, k) is not None]
        if self.enabled and given and len(given) < len(files):  # none at all: deploy local generates them
            missing = [k for k in files if k not in given]
            raise BadInputError(
                f"{DEPLOY}.tls: {', '.join(f'{DEPLOY}.tls.{k}' for k in given)} given, so it also needs "
                + ", ".join(f"{DEPLOY}.tls.{k}" for k in missing)
                + " (or none of the three, for throwaway certificates on one machine)"
            )
        if self.node_authentication and not self.enabled:
            raise BadInputError(f"{DEPLOY}.tls.node_authentication = true needs {DEPLOY}.tls.enabled = true")
        return self

    @property
    def generated(self) -> bool:
        """TLS without certificate files: ``deploy local`` makes a throwaway CA and server certificate."""
        return self.enabled and self.ca_cert is None


class DeploymentPolicy(Section):
    """[deployment]: how the roles run as separate processes on Flower (fedrecgel deploy).

    Not part of the policy digest: the same run may resume on other addresses or machines.
    """

    nodes: int = Field(
        3, ge=1, description="Client SuperNodes; each hosts a shard of the users (data, embeddings, Adam state)."
    )
    sharding: Literal["contiguous", "round-robin"] = Field(
        "contiguous",
        description="How users are spread over the nodes: contiguous blocks of ids, or user id modulo nodes.",
    )
    key_holder_dir: str = Field(
        "nodes/keyholder",
        description='Under scheme = "bfv": the state directory of the key holder, a SuperNode of its own'
        ' (--node-config role="keyholder") that keeps the secret key; never a client node\'s.'
        " Relative paths are under the deployment directory.",
    )
    stage_timeout: float = Field(
        120.0,
        gt=0,
        description="Seconds the server waits for a stage's replies; a node that misses it is dropped for the round.",
    )
    heartbeat: float = Field(
        0.5,
        gt=0,
        description="Seconds between the server's polls for replies and connected nodes"
        " (Flower 1.42 has no flag for the SuperNode heartbeat itself; a killed node is caught by stage_timeout).",
    )
    state_dir: str = Field(
        "nodes/{shard}",
        description="Each node's state directory ({shard} is its index);"
        " relative paths are under the deployment directory.",
    )
    superlink: SuperLinkPolicy = Field(SuperLinkPolicy(), description="The SuperLink's address and ports.")
    tls: TlsPolicy = Field(TlsPolicy(), description="TLS and node authentication.")
    node_keys: dict[str, IdentityKey] = Field(
        {},
        description='Identity keys pinned ahead of time: shard index ("0", "1", ..) or "keyholder" ->'
        " the 64-hex-digit key `fedrecgel deploy identity STATE_DIR` prints on that node's machine. The server"
        " refuses a node whose signed hello is under another key; shards not listed are pinned at first contact"
        " (nodes.json in the run directory).",
    )

    @model_validator(mode="after")
    def _key_holder_apart(self) -> DeploymentPolicy:
        # the secret key must not sit with a client node's state: that node could decrypt its neighbours' uploads
        clients = {self.state_dir.format(shard=k) for k in range(self.nodes)}
        if not self.key_holder_dir.strip() or self.key_holder_dir in clients:
            raise BadInputError(
                f"{DEPLOY}.key_holder_dir = {self.key_holder_dir!r}: must be a directory of its own,"
                f" not a client node's ({DEPLOY}.state_dir = {self.state_dir!r})"
            )
        return self

    @model_validator(mode="after")
    def _node_keys_name_nodes(self) -> DeploymentPolicy:
        known = {str(k) for k in range(self.nodes)} | {"keyholder"}
        for who in self.node_keys:
            if who not in known:
                raise BadInputError(
                    f"{DEPLOY}.node_keys.{who}: no such node; the keys are shard indices 0 .. {self.nodes - 1}"
                    ' (as strings) and "keyholder"'
                )
        return self

    def shard_users(self, n_users: int, shard: int):
        """The sorted user ids node ``shard`` hosts."""
        import numpy as np

        users = np.arange(n_users)
        if self.sharding == "round-robin":
            return users[users % self.nodes == shard]
        return users[users * self.nodes // max(1, n_users) == shard]


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

    @model_validator(mode="after")
    def _tower_fits(self) -> Policy:
        if any(w < 1 for w in self.model.tower):
            raise ValueError("model.tower widths must be >= 1")
        return self

    @model_validator(mode="after")
    def _clipped_bit_is_covered(self) -> Policy:
        dp, secagg = self.privacy.dp, self.privacy.secure_aggregation
        if dp.enabled and dp.adaptive_clipping is not None and secagg.scheme != "none" and secagg.cover != "shared":
            raise BadInputError(
                "privacy.dp.adaptive_clipping with privacy.secure_aggregation.cover = 'item_embeddings': each client's"
                " clipped bit travels with its upload and would be summed outside the protocol, where the server"
                " sees it; use cover = 'shared'"
            )
        return self

    @model_validator(mode="after")
    def _dp_observers_need_secure_sums(self) -> Policy:
        dp, scheme = self.privacy.dp, self.privacy.secure_aggregation.scheme
        if dp.enabled and dp.shares == "threshold" and (dp.mode != "distributed" or scheme != "masking"):
            raise BadInputError(
                f"{DP}.shares = 'threshold' sizes distributed noise shares for the masking protocol's survivor"
                " threshold: it needs mode = 'distributed' and privacy.secure_aggregation.scheme = 'masking'"
            )
        if dp.enabled and dp.max_epsilon_against == "server" and (dp.mode != "distributed" or scheme == "none"):
            raise BadInputError(
                f"{DP}.max_epsilon_against = 'server' bounds what the server learns from the noisy sums: it needs"
                " mode = 'distributed' and a secure aggregation scheme (without one the server sees each upload)"
            )
        return self

    def rhos(self) -> tuple[float, float]:
        """(rho_sh, rho_ns) in effect for the method."""
        rho_sh = self.sam.rho_sh if self.method in ("fedrecgel", "sam-shared") else 0.0
        rho_ns = self.sam.rho_ns if self.method in ("fedrecgel", "sam-private") else 0.0
        return rho_sh, rho_ns

    def to_toml(self) -> str:
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))

    def digest(self) -> str:
        """SHA-256 of the resolved policy; a checkpoint only resumes under the same digest."""
        # [deployment] says where the roles run, not what is computed: a run may move machines and still resume
        dump = self.model_dump(mode="json", exclude={"deployment"})
        if (
            self.privacy.audit == AuditPolicy()
        ):  # no canaries: the digest of runs started before [privacy.audit] existed
            del dump["privacy"]["audit"]
        secagg = dump["privacy"]["secure_aggregation"]
        # how the sum is computed (all exact, equal by test), not what: a run may resume in another mode
        del secagg["simulation"], secagg["workers"]
        if secagg["tampered"] == 0:  # the digest of runs started before the setting existed
            del secagg["tampered"]
        for field, default in (("max_epsilon_against", "release"), ("shares", "sampled")):  # likewise
            if dump["privacy"]["dp"][field] == default:
                del dump["privacy"]["dp"][field]
        canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def describe_errors(errors: ValidationError, where: str) -> str:
    """A policy's validation errors as one message: ``where``, then one line per dotted field path."""
    lines = [f"{where}: invalid policy"]
    for e in errors.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif "input" in e and e["type"] != "missing":
            msg += f" (got {e['input']!r})"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value``; the value is read as TOML (so 10, 0.5, true, [1, 2]), else as a string."""
    if "=" not in text:
        raise BadInputError(f"--set {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    path = [p.strip() for p in key.split(".")]
    if not all(path):
        raise BadInputError(f"--set {text!r}: empty part in the key {key!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise BadInputError(f"--set {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def read_policy_data(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such policy file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise BadInputError(f"{path}: cannot read the policy file ({e})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BadInputError(f"{path}: not valid TOML: {e}") from None


def load_policy(path: str | Path | None = None, overrides: list[str] = ()) -> Policy:
    """Read, override and validate a policy; ``None`` means policies/default.toml."""
    path = Path(path) if path is not None else POLICY_DIR / "default.toml"
    data = apply_overrides(read_policy_data(path), list(overrides))
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        where = str(path) + (" with --set " + " ".join(overrides) if overrides else "")
        raise BadInputError(describe_errors(e, where)) from None
