"""Errors raised by the secure-aggregation protocol.

Three kinds, kept apart:

* :class:`RejectedPayload` and :class:`KeyFileError`: bad input from a peer or a
  user, ``BadInputError`` subclasses, so the CLI reports them without a traceback;
* :class:`RoundSkipped`: an outcome, not an error of anyone's input: the round
  produced no aggregate, and the caller goes on without it;
* misuse of a role (methods called out of order) raises
  :class:`fedrecgel_secure.errors.ProtocolStateError`, a programming error.
"""

from __future__ import annotations

from enum import StrEnum

from fedrecgel_secure.errors import BadInputError


class Reason(StrEnum):
    """Why a payload was rejected; the values are stable and appear in logs and results."""

    TRUNCATED = "truncated"
    GARBAGE = "garbage"
    WRONG_KIND = "wrong_kind"
    UNKNOWN_CLIENT = "unknown_client"
    REPLAY = "replay"
    WRONG_ROUND = "wrong_round"
    BAD_SIGNATURE = "bad_signature"
    DUPLICATE_CLIENT = "duplicate_client"
    WRONG_SHAPE = "wrong_shape"
    WRONG_PARAMS = "wrong_params"
    BAD_CIPHERTEXT = "bad_ciphertext"
    NOT_IN_COHORT = "not_in_cohort"
    OUT_OF_PHASE = "out_of_phase"
    BAD_SHARE = "bad_share"
    TOO_FEW_CONTRIBUTORS = "too_few_contributors"
    BAD_KEY = "bad_key"  # an X25519 key that is all-zero or of low order
    NOT_A_SURVIVOR = "not_a_survivor"  # an unmask/consistency request that leaves the client itself out
    TOO_FEW_SHARES = "too_few_shares"  # a client would hold fewer than t shares, or keep fewer than t masking partners
    INCONSISTENT = "inconsistent"  # the consistency check failed (a split view or too few confirmations)
    ALREADY_ANSWERED = "already_answered"  # a second request after the client confirmed or answered
    NOT_A_POINT = "not_a_point"  # DPF keys whose two servers' leaf proofs differ: more than one row in a key
    OVER_BOUND = "over_bound"  # a DPF upload whose norm proof the two servers refused (docs/privacy/input-checks.md)
    TOO_MANY_REFUSALS = "too_many_refusals"  # the BFV key holder refused the run's limit of requests: it answers none


class RejectedPayload(BadInputError):
    """A payload failed a protocol check; ``reason`` is a :class:`Reason`."""

    def __init__(self, reason: Reason, detail: str, client_id: int | None = None) -> None:
        self.reason = Reason(reason)
        self.detail = detail
        self.client_id = client_id
        who = "unknown sender" if client_id is None else f"client {client_id}"
        super().__init__(f"{self.reason.value}: {detail} ({who})")


class ProtocolViolation(RejectedPayload):
    """A masking client refused a message from the aggregator and aborted its part of the round.

    ``client_id`` is the client that refused. The client keeps no state of the
    aborted attempt and releases nothing more in it; to the others it looks
    like a client that dropped out.
    """


class RoundSkipped(Exception):
    """A round could not produce an aggregate; no persistent state was changed.

    ``reason`` is a short code (``too_few_clients``, ``below_threshold``,
    ``bad_shares``), ``rejected`` maps client id to the rejection reason of every
    payload that was refused during the round.
    """

    def __init__(self, reason: str, detail: str, rejected: dict[int, str] | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.rejected = dict(rejected or {})
        super().__init__(f"round skipped ({reason}): {detail}")

    # The protocol's skip outcomes, worded once: the aggregators raise them and
    # the arithmetic simulation (:mod:`.arithmetic`) reproduces them.

    @classmethod
    def too_few_clients(cls, round_idx: int, count: int, what: str, required: int) -> RoundSkipped:
        return cls("too_few_clients", f"round {round_idx}: {count} {what}, {required} required")

    @classmethod
    def below_threshold(cls, round_idx: int, t: int, short: list[int]) -> RoundSkipped:
        return cls("below_threshold", f"round {round_idx}: fewer than {t} surviving holders for clients {short[:10]}")

    @classmethod
    def inconsistent(cls, round_idx: int, confirmed: int, required: int) -> RoundSkipped:
        return cls(
            "inconsistent", f"round {round_idx}: {confirmed} confirmations of the survivor set, {required} required"
        )

    @classmethod
    def not_admitted(cls, round_idx: int, reason: str, rejected: dict[int, str] | None = None) -> RoundSkipped:
        return cls("not_admitted", f"round {round_idx}: {reason}", rejected)


class KeyFileError(BadInputError):
    """A key file is missing, malformed, or readable by someone other than its owner."""
