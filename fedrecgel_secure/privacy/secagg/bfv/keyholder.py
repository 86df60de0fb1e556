"""The HE key holder: keeps the BFV secret key and releases exact, checked aggregates only.

Threat model: see :mod:`~fedrecgel_secure.privacy.secagg.bfv`. The key holder is trusted not to collude with the
aggregator; against an honest-but-curious aggregator it guarantees that

* nothing but an exact integer sum decoded on the fixed-point grid is ever
  released: no approximate decryption (c0 + c1·s with its error), so the
  Li–Micciancio key-recovery attack has nothing to solve;
* at most ONE aggregate is released per round (rounds only move forward), so
  no two overlapping subsets can be differenced down to one upload;
* the aggregate has exactly the dimension registered when the key holder was
  created, so sums and single uploads cannot be concatenated into one request;
* it carries at least ``min_clients`` distinct, round-bound, valid contribution
  proofs: signatures of the clients over SHA-256 of their ciphertext bytes;
* central DP noise is added here, after decryption, on the grid: the aggregator
  never learns it, and with ``noise_std`` > 0 the key holder draws it itself
  if it is not handed any;
* the decrypted sum is the sum of exactly the uploads the proofs name: every
  ciphertext's tag slot must equal <α, data> plus the named clients' pads
  (:mod:`.tags`), so one client's ciphertext presented with others' proofs,
  a sum missing a named client, double counting or slot-wise masking are
  refused, and the tag slot is never released;
* a deployment's aggregate is bound (:class:`.wire.Binding`): every proof
  must verify under the one binding it states, the digest of the model and DP
  settings its users were sent (users sent different models are never summed
  together), and under distributed noise it must hold exactly the users the
  noise shares were sized for (a server that samples fewer and states a larger
  sample gets nothing).

The key file (0600) holds the secret context and the tag master key; clients
get their tag keys from :meth:`KeyHolder.client_key` at registration.
Residuals are listed in :mod:`~fedrecgel_secure.privacy.secagg.bfv`.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import numpy as np
import tenseal as ts

from fedrecgel_secure.errors import BadInputError

from ..errors import Reason, RejectedPayload
from ..fixedpoint import FixedPoint
from ..identity import IdentityDirectory, Kind, check_session_tag
from ..keys import read_private_file, write_private_file, write_public_file
from ..vectors import check_dim, check_vector
from . import tags
from .params import BFVParams
from .wire import (
    _params_of,
    aggregate_binding,
    centre_lift,
    load_context,
    load_vectors,
    max_chunk_bytes,
    n_chunks,
    parse_aggregate,
    read_chunks,
    signing_context,
)

log = logging.getLogger("fedrecgel_secure.secagg")
_KEY_FILE_MAGIC = b"FRHEKEY1"
REFUSED = "the key holder refused this aggregate; the round is used up"  # all a refusal says, besides its reason


class KeyHolder:
    """Holds the BFV secret key; decrypts one checked aggregate per round, of the registered dimension."""

    def __init__(
        self,
        context: ts.Context,
        directory: IdentityDirectory,
        *,
        dim: int,
        min_clients: int,
        session_tag: bytes,
        encoding: FixedPoint = FixedPoint(),
        noise_std: float = 0.0,
        max_clients: int | None = None,
        tag_keys: tags.TagKeys | None = None,
    ) -> None:
        if not context.is_private():
            raise BadInputError("a key holder needs a context with the secret key")
        if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
            raise BadInputError(f"min_clients must be an integer >= 1, got {min_clients!r}")
        if not (isinstance(noise_std, (int, float)) and np.isfinite(noise_std) and noise_std >= 0):
            raise BadInputError(f"noise_std must be a finite number >= 0, got {noise_std!r}")
        self._ctx = context
        self.params = _params_of(context)
        self.directory = directory
        self.dim = check_dim(dim)
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.encoding = encoding
        self.noise_std = float(noise_std)
        self.max_clients = len(directory) if max_clients is None else max_clients
        self.params.check_capacity(encoding, self.max_clients, "privacy.secure_aggregation", self.noise_std)
        self._tags = tags.TagKeys() if tag_keys is None else tag_keys
        self._alpha = tags.alpha(
            self._tags.alpha_key(), n_chunks(self.dim, self.params), self.params.data_slots, self.params.plain_modulus
        )
        self.last_decrypted_round = -1

    @classmethod
    def create(cls, params: BFVParams, directory: IdentityDirectory, **kwargs) -> KeyHolder:
        """New keys; keyword arguments as for the constructor (dim, min_clients, session_tag, ...)."""
        return cls(params.context(), directory, **kwargs)

    @classmethod
    def load(cls, path: str | Path, directory: IdentityDirectory, **kwargs) -> KeyHolder:
        data = read_private_file(path)
        if data[: len(_KEY_FILE_MAGIC)] != _KEY_FILE_MAGIC:
            raise BadInputError(f"{path} is not a key holder file (a public context cannot decrypt)")
        start = len(_KEY_FILE_MAGIC) + tags.KEY_BYTES
        ctx = load_context(data[start:], f"key file {path}")
        if not ctx.is_private():
            raise BadInputError(f"{path} holds a public context; the key holder needs the secret key")
        return cls(ctx, directory, tag_keys=tags.TagKeys(data[len(_KEY_FILE_MAGIC) : start]), **kwargs)

    def save(self, path: str | Path) -> None:
        """Write the secret context and tag master key to a 0600 file (refused on load if others can read it)."""
        secret = self._ctx.serialize(
            save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
        )
        write_private_file(path, _KEY_FILE_MAGIC + self._tags.master + secret)

    def client_key(self, client_id: int) -> bytes:
        """The tag key client ``client_id`` needs (:class:`.bfv.BFVClient`); hand it over a confidential channel."""
        self.directory.check_known(client_id)
        return self._tags.client_key(client_id)

    def public_context(self) -> bytes:
        """Context for clients and the aggregator: encrypts, cannot decrypt."""
        return self._ctx.serialize(
            save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
        )

    def write_public_context(self, path: str | Path) -> None:
        write_public_file(path, self.public_context())

    def decrypt(self, aggregate: bytes, noise: np.ndarray | None = None) -> np.ndarray:
        """The decoded exact sum (+ central ``noise``, added here on the grid) of a checked aggregate.

        ``noise``: the central DP noise (length ``dim``); with ``noise_std`` > 0 and
        none given, the key holder draws N(0, noise_std²) itself.

        One request per round: any request for a round after the last one, accepted or
        refused, uses that round up, so a server cannot probe the key holder with variants
        of a round's ciphertexts (the raw material of reaction attacks on BFV) and keep the
        round. A refusal carries its reason class only (:class:`RejectedPayload` with a
        fixed detail); which ciphertext or check failed stays in the key holder's own log.
        """
        try:
            return self._decrypt(bytes(aggregate), noise)
        except RejectedPayload as exc:
            log.warning("key holder refused an aggregate: %s", exc)
            raise RejectedPayload(exc.reason, REFUSED) from None

    def _decrypt(self, data: bytes, noise: np.ndarray | None) -> np.ndarray:
        round_idx, dim, proofs, offset, count = parse_aggregate(data)
        if round_idx <= self.last_decrypted_round:
            raise RejectedPayload(
                Reason.REPLAY,
                f"round {round_idx}: round {self.last_decrypted_round} already had its one request",
            )
        self.last_decrypted_round = round_idx  # this request uses the round up, whatever its outcome
        if dim != self.dim or count != n_chunks(self.dim, self.params):
            raise RejectedPayload(
                Reason.WRONG_SHAPE,
                f"aggregate of dim {dim} in {count} ciphertexts; the registered dim is {self.dim}"
                f" in {n_chunks(self.dim, self.params)}",
            )
        if len(proofs) < self.min_clients:
            raise RejectedPayload(
                Reason.TOO_FEW_CONTRIBUTORS, f"{len(proofs)} contributions, at least {self.min_clients} required"
            )
        binding = aggregate_binding(data)
        if binding is not None and binding.participants and len(proofs) != binding.participants:
            # the noise shares were sized for that many users: fewer would carry less than the planned noise
            # (a server that samples a few and states a larger sample), more would not be that sample's
            raise RejectedPayload(
                Reason.INCONSISTENT,
                f"{len(proofs)} contributions, but the noise shares were sized for {binding.participants}",
            )
        context = signing_context(self.session_tag, binding)  # every proof under the aggregate's one binding
        seen: set[int] = set()
        for proof in proofs:
            if proof.client_id in seen:
                raise RejectedPayload(Reason.DUPLICATE_CLIENT, "client listed twice in the aggregate", proof.client_id)
            self.directory.verify(context, Kind.HE_UPLOAD, round_idx, proof.client_id, proof.digest, proof.signature)
            seen.add(proof.client_id)
        chunks = read_chunks(data, offset, count, max_chunk_bytes(self.params), None)
        vectors = load_vectors(self._ctx, self.params, chunks, None)
        if noise is not None:
            noise = check_vector(noise, self.dim, "central noise")
        elif self.noise_std > 0:
            rng = np.random.default_rng(secrets.randbits(128))
            noise = rng.normal(0.0, self.noise_std, self.dim)
        t = self.params.plain_modulus
        rows = np.stack([np.asarray(v.decrypt(), dtype=np.int64) for v in vectors]) % t
        self._check_tags(rows, round_idx, sorted(seen))
        total = centre_lift(rows[:, :-1].reshape(-1)[: self.dim], t)
        if noise is not None:
            total = total + self.encoding.encode_noise(noise).astype(np.int64)
        return self.encoding.decode(total)

    def _check_tags(self, rows: np.ndarray, round_idx: int, clients: list[int]) -> None:
        """Refuse unless every ciphertext's tag slot is <α, data> plus the pads of exactly the named clients."""
        t = self.params.plain_modulus
        wrong = 0  # every ciphertext is checked, so neither the refusal nor its timing says which one failed
        for c, dot in enumerate(tags.inner(self._alpha, rows[:, :-1], t)):
            pads = sum(tags.pad(self._tags.pad_key(i), self.session_tag, round_idx, c, t) for i in clients)
            wrong += (dot + pads) % t != int(rows[c, -1])
        if wrong:
            raise RejectedPayload(
                Reason.BAD_CIPHERTEXT,
                f"round {round_idx}: a ciphertext of the aggregate is not the sum of the uploads its proofs name",
            )
