"""Secure aggregation: the server learns the sum of at least ``min_clients`` uploads, never one upload.

Two schemes share one seam: a client turns its vector into signed bytes, the
aggregator combines bytes without reading any single upload, and a round
releases the aggregate alone.

* ``"ckks"``: TenSEAL CKKS encryption (Cheon et al. 2017) under a key held by a
  separate key holder, which decrypts only authenticated aggregates (:mod:`.ckks`).
* ``"masking"``: pairwise and self masks with Shamir-shared seeds for dropout
  recovery (Bonawitz et al., CCS 2017) on a SecAgg+ neighbour graph (Bell et al.,
  CCS 2020) (:mod:`.masking`), with every aggregator message signed by a
  :class:`ServerIdentity` and checked by the clients, plus the consistency
  check of the malicious-server variant.

Uploads travel in Ed25519-signed envelopes (:mod:`.identity`); key files are
owner-only (:mod:`.keys`). :func:`make_session` simulates all roles in one
process for the trainer, passing only bytes between them.

Example::

    session = make_session("ckks", dim=5000, client_ids=range(20), min_clients=10)
    result = session.run_round(0, {c: grads[c] for c in sampled})
    mean = result.total / len(result.contributors)
"""

from .ckks import CKKSAggregator, CKKSClient, CKKSParams, EncryptedAggregate, KeyHolder
from .errors import KeyFileError, ProtocolViolation, Reason, RejectedPayload, RoundSkipped
from .identity import ClientIdentity, ContributionProof, Envelope, IdentityDirectory, Kind, ServerIdentity
from .fixedpoint import FixedPoint
from .masking import MaskingParams, neighbour_graph
from .masking_aggregator import MaskedSum, MaskingAggregator
from .masking_client import MaskingClient
from .session import RoundResult, SecAggSession, make_session

__all__ = [
    "CKKSAggregator",
    "CKKSClient",
    "CKKSParams",
    "ClientIdentity",
    "ContributionProof",
    "EncryptedAggregate",
    "FixedPoint",
    "Envelope",
    "IdentityDirectory",
    "KeyFileError",
    "KeyHolder",
    "Kind",
    "MaskedSum",
    "MaskingAggregator",
    "MaskingClient",
    "MaskingParams",
    "ProtocolViolation",
    "Reason",
    "RejectedPayload",
    "RoundResult",
    "RoundSkipped",
    "SecAggSession",
    "ServerIdentity",
    "make_session",
    "neighbour_graph",
]
