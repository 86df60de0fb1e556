"""Who a secure-aggregation round releases the sum of, decided without the cryptography (simulation only).

Every scheme is exact. Masking releases Σ g_i mod 2^64 over the survivors,
BFV Σ g_i mod t over the valid uploads, DPF Σ g_i in its group over the checked uploads (g_i with the rows past
its budget zeroed, :meth:`.dpf.params.DPFParams.restrict`), where g_i are client i's fixed-point
integers (its upload plus its DP noise share, clipped: :meth:`FixedPoint.encode`),
and both read that sum as a signed integer inside the range that
:meth:`FixedPoint.check_capacity` guarantees. So a round's release is the
plain integer sum of the contributors' g_i (plus central noise on the grid),
and *who* contributes follows from facts that need no keys: the cohort, who
goes silent after masking or has an upload refused, the public round seed
(which fixes masking's neighbour graph), and the caller's admit check.
:func:`contributors` applies the protocol's checks to those facts in the
protocol's order and raises the same :class:`RoundSkipped`.

Every client here is honest (nothing plays a malicious server or a client that
refuses a message), so the outcomes are those of an honest run with dropouts
and refused uploads; a client's own checks then always pass. The equivalence
with the full protocol is a test (``tests/secagg/test_secagg_arithmetic.py``), not an
assumption.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .errors import RoundSkipped


def contributors(
    params,
    cohort: Iterable[int],
    lost: set[int],
    *,
    min_clients: int,
    round_idx: int,
    round_seed: bytes,
    admit: Callable[[list[int]], str | None] | None = None,
) -> list[int]:
    """The sorted ids whose uploads the round sums, or :class:`RoundSkipped` as the protocol would raise it.

    ``cohort``: every client that takes part (advertises keys, or encrypts);
    ``lost``: those whose upload never counts (silent after masking, or refused).
    The scheme's own checks are its parameters' ``arithmetic_contributors`` (masking's:
    :meth:`.masking.masks.MaskingParams.arithmetic_contributors`; BFV's and DPF's: :func:`every_valid_upload`).
    """
    cohort = sorted(cohort)
    survivors = [c for c in cohort if c not in lost]
    return params.arithmetic_contributors(
        cohort, survivors, min_clients=min_clients, round_idx=round_idx, round_seed=round_seed, admit=admit
    )


def every_valid_upload(
    survivors: list[int], *, min_clients: int, round_idx: int, admit: Callable[[list[int]], str | None] | None
) -> list[int]:
    """A scheme that sums every valid upload: all survivors, if at least ``min_clients`` and admitted.

    BFV: the aggregator sums every valid ciphertext; the key holder decrypts a sum of >= min_clients.
    DPF: both servers sum every upload both accepted (an honest client's keys pass the check)."""
    if len(survivors) < min_clients:
        raise RoundSkipped.too_few_clients(round_idx, len(survivors), "valid uploads", min_clients)
    admit_or_skip(admit, survivors, round_idx)
    return survivors


def admit_or_skip(admit, ids: list[int], round_idx: int, rejected: dict[int, str] | None = None) -> None:
    """Ask the caller's ``admit`` about the contributors; a reason it returns skips the round (``not_admitted``)."""
    reason = None if admit is None else admit(sorted(ids))
    if reason is not None:
        raise RoundSkipped.not_admitted(round_idx, reason, rejected)
