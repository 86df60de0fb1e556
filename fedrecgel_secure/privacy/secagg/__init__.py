"""Secure aggregation: the server learns the sum of at least ``min_clients`` uploads, never one upload.

Three schemes share one seam: a client turns its vector into signed bytes, the
aggregator combines bytes without reading any single upload, and a round
releases the aggregate alone. All sum the same fixed-point integers
(:mod:`.fixedpoint`), so they release bit-identical aggregates.

* ``"bfv"``: exact TenSEAL BFV encryption of the fixed-point grid integers under
  a key held by a separate key holder (:mod:`.bfv`), which
  releases one exact, checked aggregate per round and adds central noise
  itself. It protects against an honest-but-curious aggregator that does not
  collude with the key holder; against a malicious or colluding server use
  masking. (CKKS was removed: its approximate decryptions leak the secret key,
  Li and Micciancio, Eurocrypt 2021.)
* ``"dpf"``: two servers that do not collude (the aggregator and a key holder)
  each get one key of every pair of distributed point functions that carry a
  client's touched item rows, so the upload follows the rows touched, not the
  catalogue (:mod:`.dpf`); the key holder adds central noise.
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

import importlib

# Each public name and the submodule that defines it. They are imported on first use (PEP 562): the protocols
# pull in TenSEAL and cryptography, which a run without secure aggregation never needs, yet it reads
# :mod:`.fixedpoint` through this package (`fedrecgel train` starts faster, benchmarks/cli_startup.py).
_EXPORTS = {
    "KeyFileError": "errors",
    "ProtocolViolation": "errors",
    "Reason": "errors",
    "RejectedPayload": "errors",
    "RoundSkipped": "errors",
    "FixedPoint": "fixedpoint",
    "EncryptedAggregate": "bfv.aggregator",
    "BFVAggregator": "bfv.aggregator",
    "BFVClient": "bfv.client",
    "KeyHolder": "bfv.keyholder",
    "BFVParams": "bfv.params",
    "ClientIdentity": "identity",
    "ContributionProof": "identity",
    "Envelope": "identity",
    "IdentityDirectory": "identity",
    "Kind": "identity",
    "ServerIdentity": "identity",
    "MaskingParams": "masking.masks",
    "neighbour_graph": "masking.masks",
    "MaskedSum": "masking.aggregator",
    "MaskingAggregator": "masking.aggregator",
    "MaskingClient": "masking.client",
    "RoundResult": "session",
    "SecAggSession": "session",
    "make_session": "session",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
