"""[privacy.secure_aggregation]: how the server sums the uploads.

The protocols are :mod:`fedrecgel_secure.privacy.secagg`; the parameters they take from these settings are built
in :mod:`fedrecgel_secure.privacy.secagg.settings`.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy.section import Section
from fedrecgel_secure.scheme_facts import RETIRED, facts_of


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
    max_refusals: int = Field(
        3,
        ge=1,
        description="Aggregates the key holder may refuse in a run (its refusals are kept on its own disk); then it"
        " refuses every request, and the run gets no more sums. Each refusal is one bit of a decryption-validity"
        " oracle, the raw material of reaction attacks on BFV, and an honest server's aggregates are refused only"
        " when something is wrong. An aggregate of a round outside the run counts; one of a round at or before the"
        " last it answered (a server resumed from an older checkpoint repeats those), or with fewer users than"
        " min_clients or than the noise shares were sized for (nodes that dropped out), is refused without counting.",
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


class DpfPolicy(Section):
    """Two-server distributed point functions: each client's touched item rows as DPF keys, one of every pair to the
    aggregator and one to the key holder, which must not collude; the upload follows R, not the catalogue."""

    budget: int = Field(
        256,
        ge=1,
        description="R: the most item-table rows a client's upload carries; every client sends keys for"
        " ceil(1.5 R) buckets whatever it touched, so the count does not leak. A client that touched more keeps"
        " the R rows of largest norm and drops the rest of its update (counted in the log).",
    )
    value_bits: Literal[32, 64] = Field(
        64,
        description="The group the values are summed in: 64 (Field64, the field of the norm check) or 32 (Z_2^32,"
        " half the upload; the grid's"
        " clip_range, frac_bits and the clients per round must let a round's sum fit, checked at the start).",
    )
    norm_check: bool = Field(
        True,
        description="With DP: each upload proves (PINE's proof, in Field64) that its L2 norm on the grid is within"
        " privacy.dp.clip_norm, and the two servers drop one whose proof fails (docs/privacy/input-checks.md); about"
        " 5% more upload. Needs value_bits = 64, a fixed clip norm, device = 'cpu' and a grid the field holds:"
        " frac_bits at most 31 - log2(B), the default then (B = sqrt(clip_norm^2 + the metrics a round's users may"
        " report inside the sum, each at most 1)). Without DP there is no clip norm and nothing is checked.",
    )
    device: Literal["cpu", "auto", "cuda"] = Field(
        "cpu",
        description="Where the two servers expand keys, each under its own policy (the same bits either way, so"
        " not in the digest); cpu: numpy with cryptography's AES-NI, constant-time; cuda: torch on a GPU, whose"
        " AES (tensor operations) indexes tables by key-share bytes and is not constant-time, for a server whose"
        " GPU no one else can time; auto: cuda where torch sees a GPU, else cpu.",
    )


# A sum hides each member only among the others in it. With one colluder (a client, or a user the server invents in
# the directory it builds) the server learns the sum of min_clients - 1 honest uploads; at 10 that is 9 of them, so
# isolating one user takes 9 colluders in the same round rather than 1 (at the old default, 2, it took one).
SAFE_MIN_CLIENTS = 10


class SecureAggregationPolicy(Section):
    scheme: Literal["none", "bfv", "masking", "dpf"] = Field(
        "none",
        description="How uploads are summed; none: in the clear; bfv: exact homomorphic encryption;"
        " masking: pairwise masks; dpf: distributed point functions over two non-colluding servers (the"
        " aggregator and the key holder), an upload that follows the rows a client touched.",
    )
    min_clients: int = Field(
        SAFE_MIN_CLIENTS,
        ge=1,
        description=f"The server learns a sum only of at least this many valid uploads; below {SAFE_MIN_CLIENTS}"
        " only with allow_small_cohort = true.",
    )
    allow_small_cohort: bool = Field(
        False,
        description=f"Accept min_clients below {SAFE_MIN_CLIENTS}: one colluding client (or one user the server"
        " invents) in so small a sum leaves few enough others to single them out. For tests and demos only.",
    )
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
    dpf: DpfPolicy = Field(DpfPolicy(), description='Two-server DPF parameters, used when scheme = "dpf".')

    @model_validator(mode="before")
    @classmethod
    def _no_ckks(cls, data: Any) -> Any:
        retired = isinstance(data, dict) and data.get("scheme") in RETIRED
        if isinstance(data, dict) and (retired or "ckks" in data):
            field = 'scheme = "ckks"' if retired else "[privacy.secure_aggregation.ckks]"
            raise BadInputError(
                f"privacy.secure_aggregation: {field} is no longer supported: approximate CKKS decryptions let"
                " whoever receives them solve for the secret key and decrypt single uploads (Li and Micciancio,"
                ' Eurocrypt 2021); use scheme = "bfv" (exact, same fixed-point grid) or "masking"'
            )
        return data

    @model_validator(mode="after")
    def _cohort_floor(self) -> SecureAggregationPolicy:
        if facts_of(self.scheme).sealed and self.min_clients < SAFE_MIN_CLIENTS and not self.allow_small_cohort:
            raise BadInputError(
                f"privacy.secure_aggregation.min_clients = {self.min_clients} is below {SAFE_MIN_CLIENTS}: one"
                " colluding or invented client would leave a sum of too few others; set"
                " privacy.secure_aggregation.allow_small_cohort = true to accept that (tests, demos)"
            )
        return self

    def small_cohort_warning(self) -> str | None:
        """What the start line says when the policy accepted a cohort below the safe floor, or None."""
        if not facts_of(self.scheme).sealed or self.min_clients >= SAFE_MIN_CLIENTS:
            return None
        return (
            f"privacy.secure_aggregation.min_clients = {self.min_clients} (allow_small_cohort): the server may learn"
            f" the sum of {self.min_clients} uploads, so {self.min_clients - 1} colluding or invented clients"
            " expose the last one"
        )

    def worker_count(self) -> int:
        """The worker processes protocol mode uses (``workers``, with auto resolved to this machine's cores)."""
        if self.workers != "auto":
            return self.workers
        try:
            return len(os.sched_getaffinity(0))  # the cores this process may run on
        except AttributeError:  # not Linux
            return os.cpu_count() or 1
