"""Secure aggregation: the server learns the sum of at least ``min_clients`` uploads, never one upload.

Two schemes share one seam: a client turns its vector into signed bytes, the
aggregator combines bytes without reading any single upload, and a round
releases the aggregate alone. Both sum the same fixed-point integers
(:mod:`.fixedpoint`), so they release bit-identical aggregates.

* ``"bfv"``: exact TenSEAL BFV encryption of the fixed-point grid integers under
  a key held by a separate key holder (:mod:`.he`, :mod:`.he_keyholder`), which
  releases one exact, checked aggregate per round and adds central noise
  itself. It protects against an honest-but-curious aggregator that does not
  collude with the key holder; against a malicious or colluding server use
  masking. (CKKS was removed: its approximate decryptions leak the secret key,
  Li and Micciancio, Eurocrypt 2021.)
* ``"masking"``: pairwise and self masks with Shamir-shared seeds for dropout
  recovery (Bonawitz et al., CCS 2017) on a SecAgg+ neighbour graph (Bell et al.,
  CCS 2020) (:mod:`.masking`), with every aggregator message signed by a
  :class:`ServerIdentity` and checked by the clients, plus the consistency
  check of the malicious-server variant.

Uploads travel in Ed25519-signed envelopes (:mod:`.identity`); key files are
owner-only (:mod:`.keys`). :func:`make_session` simulates all roles in one
process for the trainer, passing only bytes between them.

Example::

    session = make_session("bfv", dim=5000, client_ids=range(20), min_clients=10)
    result = session.run_round(0, {c: grads[c] for c in sampled})
    mean = result.total / len(result.contributors)
"""

from .errors import KeyFileError, ProtocolViolation, Reason, RejectedPayload, RoundSkipped
from .fixedpoint import FixedPoint
from .he import EncryptedAggregate, HEAggregator, HEClient
from .he_keyholder import KeyHolder
from .he_params import BFVParams
from .identity import ClientIdentity, ContributionProof, Envelope, IdentityDirectory, Kind, ServerIdentity
from .masking import MaskingParams, neighbour_graph
from .masking_aggregator import MaskedSum, MaskingAggregator
from .masking_client import MaskingClient
from .session import RoundResult, SecAggSession, make_session

__all__ = [
    "BFVParams",
    "ClientIdentity",
    "ContributionProof",
    "EncryptedAggregate",
    "Envelope",
    "FixedPoint",
    "HEAggregator",
    "HEClient",
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
