"""What each value of ``privacy.secure_aggregation.scheme`` is, as facts without behaviour: one frozen row a scheme.

The policy's validators, the DP resolution, the run index and the scheme tables that add behaviour
(:mod:`fedrecgel_secure.privacy.secagg.schemes`: parameters and sessions; :mod:`fedrecgel_secure.deploy.schemes`:
the deployment's parts) read a scheme's facts from here instead of comparing its name, so a fact is stated once
and a new scheme is one new row. This module sits below every layer: it imports nothing from the package, so the
policy reads it without reaching the privacy code (``tests/test_import_layers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchemeFacts:
    """One scheme's facts (what it is, not what it runs)."""

    name: str
    # the clients' uploads reach the server only inside the protocol's sum, never one by one
    sealed: bool
    # a party of its own holds the secret key and decrypts the sum (in a deployment, one more node)
    key_holder: bool
    # the upload carries the item-table rows a client touched (its params take the table's shape)
    sparse: bool = False
    # clients may add distributed DP noise shares to their uploads (a dense share would touch every row a sparse
    # scheme keeps sparse)
    noise_shares: bool = True
    # distributed noise shares may be sized for the protocol's survivor threshold (privacy.dp.shares = "threshold")
    threshold_shares: bool = False
    # each upload proves its L2 norm within DP's clip norm and the servers drop one whose proof fails (its
    # section's norm_check switch; docs/privacy/input-checks.md)
    norm_check: bool = False


# the DPF norm check's grid: B = ⌈C · 2^f⌉ must stay within 2^31 for Field64's squares (3B² < p) and wraparound
# tests, so f ≤ NORM_CHECK_GRID_BITS − log2 C
NORM_CHECK_GRID_BITS = 31


FACTS: dict[str, SchemeFacts] = {
    f.name: f
    for f in (
        SchemeFacts("none", sealed=False, key_holder=False),
        SchemeFacts("masking", sealed=True, key_holder=False, threshold_shares=True),
        SchemeFacts("bfv", sealed=True, key_holder=True),
        SchemeFacts("dpf", sealed=True, key_holder=True, sparse=True, noise_shares=False, norm_check=True),
    )
}

# names a policy or a session once accepted and now refuses, each caller with its own message
RETIRED = ("ckks",)


def facts_of(name: str) -> SchemeFacts:
    """The row of the scheme ``name`` (a value of ``privacy.secure_aggregation.scheme``)."""
    return FACTS[name]
