"""Secure aggregation with exact homomorphic encryption: TenSEAL BFV on the fixed-point grid.

Threat model, plainly. HE protects the clients' uploads from an
**honest-but-curious aggregator that does not collude with the key holder**:
the aggregator sees ciphertexts and the released sum, nothing else. A
*malicious* aggregator (one that forges or reorders what it forwards), or one
that colludes with the key holder, is out of scope: the key holder checks what
it can (below) and refuses the forgeries of finding 2 of issue #10, but a
malicious server is not what it is designed against.
Deployments that must resist a malicious server should use ``"masking"``
(:mod:`.masking`), which needs no key holder.

Binding proofs to ciphertexts. Each client signs SHA-256 of its ciphertext
bytes (in a group, :class:`HEGroup`, the group's one ciphertext), and each
ciphertext carries in its last slot a linearly homomorphic tag
of its data (:mod:`.bfv_tags`) under keys shared only by that client and the key
holder. The key holder receives only the summed ciphertext, checks the
signatures (round-bound, distinct, at least ``min_clients``) and, after
decrypting, that the tags add up to those of exactly the clients the proofs
name; otherwise it releases nothing. Having the key holder re-add the signed
uploads itself would be as cheap (about 0.3 ms per ciphertext here, 2 s per
FilmTrust round) but would hand it every single ciphertext with the key.
Residuals: a refused forgery has still been decrypted by the key holder, which
so may see one upload (it never releases it); an aggregator colluding with
clients can fill their places with values it knows, so the release reveals the
honest clients' sum only down to ``min_clients`` minus the colluders (as for
any secure sum); a forged tag passes with probability about 1/t ≈ 2^-59.

Roles:

* :class:`~.bfv_keyholder.KeyHolder` creates the BFV key pair and keeps the
  secret key; it publishes a *public* context (public key only). It releases
  at most one aggregate per round, of the dimension registered when it was
  created, carrying at least ``min_clients`` distinct, valid contribution
  proofs of that round whose tags match the decrypted sum, and it adds the
  central DP noise itself.
* :class:`HEClient` puts its vector on the shared fixed-point grid
  (:class:`.fixedpoint.FixedPoint`, the same integers masking sums), tags
  them, encrypts them as BFV plaintexts mod the prime t, and signs SHA-256 of
  the ciphertext bytes (the envelope of :mod:`.identity`).
* :class:`HEGroup` is several clients of one host (a deployment's node): their
  grid vectors added up, tagged with all their pads, encrypted once and signed
  by each of them; it decrypts to exactly what their single uploads would.
* :class:`HEAggregator` holds only the public context; it checks each envelope
  (or group), adds the ciphertexts as they arrive and forwards the sum with the
  proofs (client id, digest of the ciphertext bytes it signed, signature).

Why BFV and not CKKS. CKKS decryption is approximate: the decrypted value is
c0 + c1·s *including* the encryption error, so whoever receives it can solve a
linear system for the secret key s (Li and Micciancio, Eurocrypt 2021). BFV
decryption rounds the error away and the key holder releases only the exact
integer sum decoded on the grid, so the release equals Σ m_i and carries no
information about the error: the linear system has the unknown, large error
term on its right-hand side (see tests/attacks/test_he_key_recovery.py).
Because the grid is the masking grid, HE and masking release bit-identical
aggregates.

Wire formats (:mod:`.bfv_wire`; body of a ``Kind.HE_UPLOAD`` envelope)::

    upload:    b"BFV1" | dim u32 | n_chunks u32 | (len u32 | TenSEAL BFVVector)*
    aggregate: b"BFA1" | round u64 | dim u32 | n u32 | proof*n
               | n_chunks u32 | (len u32 | BFVVector)*
               where proof = client u32 | SHA-256(upload body) | signature (100 bytes)
    bound:     b"BFA2" | round u64 | dim u32 | n u32 | participants u32 | digest 32 | proof*n | (as BFA1)

Binding (a deployment). A node's users sign their group's ciphertext under a
:class:`~.bfv_wire.Binding`: the digest of the model and DP settings their node
was sent, and the sample their noise shares were sized for. The aggregator
sums only partials of one binding, and the key holder verifies every proof
under the binding the aggregate states: users sent different models (model
inconsistency) cannot be summed together, and under distributed noise it
decrypts only an aggregate of exactly the users the shares were sized for.

Parameters. N = 8192, coefficient moduli (60, 60, 60) bits (180 of the 218 the
HomomorphicEncryption.org standard allows for 128-bit security at N = 8192;
the last prime is SEAL's key-switching prime, so ciphertexts live mod 120
bits), plain modulus t the largest 59-bit prime ≡ 1 mod 2N (SEAL's batching
needs t ≡ 1 mod 2N; it rejects 60 bits). One ciphertext packs N − 1 = 8191
grid integers and their tag; an upload is about 32 bytes per value.

Range. The sum is exact while every coordinate satisfies |Σ g_i| < t/2;
:meth:`.bfv_wire.ContextInfo.check_capacity` (run when the key holder is created,
for every registered client) refuses any setting where
``max_clients`` clipped values plus 10σ of central noise could reach it, and
where the BFV noise of that many summed ciphertexts could reach q/(2t).
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tenseal as ts

from fedrecgel_secure.errors import BadInputError

from . import bfv_tags
from .bfv_wire import (  # noqa: F401  re-exported: the wire helpers belong to the HE scheme
    _U32,
    _UPLOAD_HEAD,
    Binding,
    ContextInfo,
    _params_of,
    aggregate_binding,
    aggregate_head,
    centre_lift,
    decode_upload,
    encrypt_ints,
    frame,
    load_context,
    load_vectors,
    max_chunk_bytes,
    n_chunks,
    parse_aggregate,
    read_chunks,
    signing_context,
)
from .errors import Reason, RejectedPayload, RoundSkipped
from .fixedpoint import FixedPoint
from .identity import (
    ClientIdentity,
    ContributionProof,
    Envelope,
    IdentityDirectory,
    Kind,
    check_header,
    check_round,
    check_session_tag,
    verify_signature,
)
from .vectors import check_dim, check_upload

log = logging.getLogger("fedrecgel_secure.secagg")

HE_UPLOAD = Kind.HE_UPLOAD


class HEClient:
    """Encodes one client's vector on the grid, tags it, encrypts it with the public context and signs it.

    ``tag_key``: the 64 bytes the key holder gave this client at registration
    (:meth:`.bfv_keyholder.KeyHolder.client_key`), over a confidential channel.
    """

    def __init__(
        self,
        identity: ClientIdentity,
        public_context: bytes | ts.Context,
        dim: int,
        *,
        encoding: FixedPoint,
        session_tag: bytes,
        tag_key: bytes,
    ) -> None:
        # A loaded context is accepted so that simulated clients can share one; it must still be public.
        ctx = (
            public_context if isinstance(public_context, ts.Context) else load_context(public_context, "client context")
        )
        if ctx.is_private():
            raise BadInputError("a client must get the public context, not one with the secret key")
        self._ctx = ctx
        self.params = _params_of(ctx)
        self.identity = identity
        self.dim = check_dim(dim)
        self.encoding = encoding
        if 2 * encoding.limit >= self.params.plain_modulus:
            raise BadInputError("the fixed-point range does not fit the BFV plain modulus")
        self.session_tag = check_session_tag(session_tag)
        if not isinstance(tag_key, (bytes, bytearray)) or len(tag_key) != bfv_tags.CLIENT_KEY_BYTES:
            raise BadInputError(f"tag_key must be the {bfv_tags.CLIENT_KEY_BYTES} bytes the key holder issued")
        self._pad_key = bytes(tag_key[bfv_tags.KEY_BYTES :])
        self._alpha = bfv_tags.alpha(
            bytes(tag_key[: bfv_tags.KEY_BYTES]),
            n_chunks(dim, self.params),
            self.params.data_slots,
            self.params.plain_modulus,
        )
        self.last_clipped = 0

    def upload(self, round_idx: int, x: np.ndarray, noise: np.ndarray | None = None) -> bytes:
        """Signed envelope of ``x`` (plus its DP ``noise`` share) on the grid, tagged and encrypted."""
        check_round(round_idx)
        body = self.encrypt(round_idx, self.rows(x, noise), [self._pad_key])
        return self.identity.seal(HE_UPLOAD, round_idx, body, self.session_tag)

    def rows(self, x: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """``x`` (plus its ``noise`` share) on the grid, one zero-padded row per ciphertext; sets ``last_clipped``."""
        x = check_upload(x, self.dim, self.identity.client_id)
        ints, self.last_clipped = self.encoding.encode(x, noise)
        rows = np.zeros(self._alpha.shape[1:], dtype=np.int64)
        rows.reshape(-1)[: self.dim] = ints
        return rows

    def encrypt(self, round_idx: int, rows: np.ndarray, pad_keys: list[bytes]) -> bytes:
        """Upload body of grid ``rows`` (signed, |v| < t/2), each tagged with <α, row> plus the pads of
        ``pad_keys``: this client's alone, or a group's (:class:`HEGroup`)."""
        t = self.params.plain_modulus
        tags = [
            (dot + sum(bfv_tags.pad(k, self.session_tag, round_idx, c, t) for k in pad_keys)) % t
            for c, dot in enumerate(bfv_tags.inner(self._alpha, rows, t))
        ]
        return encrypt_ints(self._ctx, self.params, self.dim, rows, tags)


class HEGroup:
    """The clients of one host (a deployment's node) as one contribution: their grid vectors added up, tagged
    with all their pads and encrypted once, every client signing that one ciphertext.

    It decrypts to exactly what the sum of their :class:`HEClient` uploads
    decrypts to: the data slots hold the same grid sum mod t, and a tag is
    linear in its row with pads that add, so the key holder's checks and its
    release are unchanged (``tests/test_secagg_he_group.py``). The host
    encrypts one vector instead of one per client (FilmTrust: about 30 users
    a node, 372,737 values each). It sees its clients' vectors anyway, since
    it computes them; the server still sees ciphertexts only, and checks that
    each named client signed exactly this ciphertext
    (:meth:`HEAggregator.receive_partial`).
    """

    def __init__(self, clients: list[HEClient]) -> None:
        if not clients:
            raise BadInputError("a group needs at least one client")
        first = clients[0]
        if any((c.dim, c.session_tag, c.encoding) != (first.dim, first.session_tag, first.encoding) for c in clients):
            raise BadInputError("a group's clients must share one session, dimension and grid")
        self.clients = clients
        self.last_clipped = 0

    def partial(
        self, round_idx: int, x: np.ndarray, noise: np.ndarray | None = None, binding: Binding | None = None
    ) -> bytes:
        """The partial aggregate (:meth:`EncryptedAggregate.serialize`) of row ``i`` of ``x`` (plus row ``i`` of
        ``noise``) from ``clients[i]``, each proof signed under ``binding`` (a deployment's node); ``last_clipped``
        counts the values the grid clipped."""
        check_round(round_idx)
        first, t = self.clients[0], self.clients[0].params.plain_modulus
        total, self.last_clipped = None, 0
        for i, client in enumerate(self.clients):
            rows = client.rows(x[i], None if noise is None else noise[i]) % t  # in [0, t): no int64 overflow
            total = rows if total is None else (total + rows) % t
            self.last_clipped += client.last_clipped
        body = first.encrypt(round_idx, centre_lift(total, t), [c._pad_key for c in self.clients])
        digest = hashlib.sha256(body).digest()
        signed = sorted(self.clients, key=lambda c: c.identity.client_id)
        proofs = [
            ContributionProof(
                c.identity.client_id,
                digest,
                c.identity.sign(HE_UPLOAD, round_idx, digest, signing_context(c.session_tag, binding)),
            )
            for c in signed
        ]
        head = aggregate_head(round_idx, first.dim, len(proofs), binding)
        # the body's chunk count and ciphertexts are the aggregate's tail, byte for byte
        return head + b"".join(p.to_bytes() for p in proofs) + body[_UPLOAD_HEAD.size - _U32.size :]


class EncryptedAggregate:
    """Sum of a round's ciphertexts, with the proofs of who contributed."""

    def __init__(
        self, round_idx: int, dim: int, proofs: list[ContributionProof], vectors: list, binding: Binding | None = None
    ) -> None:
        self.round_idx = round_idx
        self.dim = dim
        self.proofs = proofs
        self._vectors = vectors
        self.binding = binding

    @property
    def contributors(self) -> list[int]:
        return sorted(p.client_id for p in self.proofs)

    def serialize(self) -> bytes:
        head = aggregate_head(self.round_idx, self.dim, len(self.proofs), self.binding)
        chunks = [v.serialize() for v in self._vectors]
        return head + b"".join(p.to_bytes() for p in self.proofs) + _U32.pack(len(chunks)) + frame(chunks)


class HEAggregator:
    """Adds encrypted uploads; holds only the public context and never a plaintext upload."""

    def __init__(
        self, public_context: bytes, directory: IdentityDirectory, dim: int, *, min_clients: int, session_tag: bytes
    ) -> None:
        ctx = load_context(public_context, "aggregator context")
        if ctx.is_private():
            raise BadInputError(
                "the aggregator was given a context that contains the secret key; give it the public context"
            )
        if min_clients < 1:
            raise BadInputError(f"min_clients must be >= 1, got {min_clients}")
        self._ctx = ctx
        self.params = _params_of(ctx)
        self.directory = directory
        self.dim = check_dim(dim)
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_completed_round = -1
        self._round: int | None = None
        self._proofs: dict[int, ContributionProof] = {}
        self._binding: Binding | None = None  # the round's: every contribution's must be the same
        self._sum: list | None = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_public_context_file(
        cls, path: str | Path, directory: IdentityDirectory, dim: int, *, min_clients: int, session_tag: bytes
    ) -> HEAggregator:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise BadInputError(f"{path}: cannot read public context ({exc.strerror})") from None
        if data.startswith(b"FRHEKEY1"):
            raise BadInputError(
                f"{path} is the key holder's file and contains the secret key; give the aggregator the public context"
            )
        return cls(data, directory, dim, min_clients=min_clients, session_tag=session_tag)

    @property
    def context(self) -> ts.Context:
        return self._ctx

    @property
    def contributors(self) -> list[int]:
        return sorted(self._proofs)

    def begin_round(self, round_idx: int) -> None:
        check_round(round_idx)
        if round_idx <= self.last_completed_round:
            raise BadInputError(f"round {round_idx} is not after the last completed round {self.last_completed_round}")
        self._round, self._proofs, self._sum, self._binding = round_idx, {}, None, None

    def receive(self, payload: bytes) -> int:
        """Check one upload and add it to the running sum; returns the client id."""
        if self._round is None:
            raise BadInputError("begin_round() must be called before receiving uploads")
        try:
            env = Envelope.parse(payload, zero_copy=True)
            check_header(
                env,
                directory=self.directory,
                kind=HE_UPLOAD,
                round_idx=self._round,
                completed_round=self.last_completed_round,
            )
            # Hashing releases the GIL while TenSEAL's loader does not, so the body is hashed in a
            # thread while the ciphertexts load; nothing is added before the signature is checked.
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="secagg-hash")
            hashing = self._pool.submit(hashlib.sha256, env.body)
            try:
                vectors, problem = decode_upload(env.body, self._ctx, self.params, self.dim, env.client_id), None
            except RejectedPayload as exc:
                vectors, problem = None, exc
            verify_signature(env, directory=self.directory, context=self.session_tag, digest=hashing.result().digest())
            if self._proofs and self._binding is not None:
                raise RejectedPayload(Reason.INCONSISTENT, "an unbound upload in a round of bound ones", env.client_id)
            if env.client_id in self._proofs:
                raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already contributed this round", env.client_id)
            if problem is not None:
                raise problem
        except RejectedPayload as exc:
            log.warning("round %s: rejected HE upload from %s: %s", self._round, exc.client_id, exc)
            raise
        if self._sum is None:
            self._sum = vectors
        else:
            for acc, vec in zip(self._sum, vectors):
                acc.add_(vec)
        self._proofs[env.client_id] = ContributionProof(env.client_id, env.digest, env.signature)
        return env.client_id

    def receive_partial(self, data: bytes, cohort: set[int] | None = None) -> list[int]:
        """Add a group's partial aggregate (:meth:`HEGroup.partial`), the one ciphertext a host of several
        clients (a deployment's node) made of its own clients' vectors; returns their ids.

        Each proof is checked as an upload's would be: a known client, this
        round, not yet counted (and in ``cohort``, if given), a valid signature,
        and its digest must be that of this very ciphertext (``bad_signature``
        otherwise): every named client signed exactly what is added. That the
        ciphertext holds their vectors, each with weight one, is what the key
        holder's tags check (:mod:`.bfv_tags`). A host that knows its clients'
        tag keys could forge their part, as it could make them upload anything:
        the clients trust their host.
        """
        if self._round is None:
            raise BadInputError("begin_round() must be called before receiving uploads")
        data = bytes(data)
        round_idx, dim, proofs, offset, count = parse_aggregate(data)
        binding = aggregate_binding(data)
        if round_idx != self._round:
            raise RejectedPayload(
                Reason.WRONG_ROUND, f"a partial aggregate of round {round_idx} in round {self._round}"
            )
        if self._proofs and binding != self._binding:  # users sent other models, or shares sized otherwise
            raise RejectedPayload(Reason.INCONSISTENT, "a partial aggregate bound otherwise than the round's others")
        if dim != self.dim or count != n_chunks(self.dim, self.params):
            raise RejectedPayload(Reason.WRONG_SHAPE, f"partial aggregate of dim {dim} in {count} ciphertexts")
        ids = [p.client_id for p in proofs]
        if not ids or len(set(ids)) != len(ids) or set(ids) & set(self._proofs):
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "a partial aggregate names no client, or one twice")
        if cohort is not None and not set(ids) <= cohort:
            raise RejectedPayload(Reason.NOT_IN_COHORT, f"a partial aggregate names {sorted(set(ids) - cohort)[:10]}")
        signed = hashlib.sha256(_UPLOAD_HEAD.pack(b"BFV1", dim, count))  # the group's upload body (HEGroup.partial)
        signed.update(memoryview(data)[offset:])
        digest = signed.digest()
        context = signing_context(self.session_tag, binding)
        for p in proofs:
            self.directory.verify(context, HE_UPLOAD, round_idx, p.client_id, p.digest, p.signature)
            if p.digest != digest:
                raise RejectedPayload(Reason.BAD_SIGNATURE, "signed another ciphertext than the group's", p.client_id)
        vectors = load_vectors(
            self._ctx, self.params, read_chunks(data, offset, count, max_chunk_bytes(self.params), None), None
        )
        if self._sum is None:
            self._sum = vectors
        else:
            for acc, vec in zip(self._sum, vectors):
                acc.add_(vec)
        self._proofs.update({p.client_id: p for p in proofs})
        self._binding = binding
        return sorted(ids)

    def finish(self) -> EncryptedAggregate:
        """Close the round; raises :class:`RoundSkipped` (state unchanged) below ``min_clients``."""
        if self._round is None:
            raise BadInputError("no round in progress")
        if len(self._proofs) < self.min_clients or self._sum is None:
            skipped = RoundSkipped.too_few_clients(self._round, len(self._proofs), "valid uploads", self.min_clients)
            self._round, self._proofs, self._sum = None, {}, None
            raise skipped
        aggregate = EncryptedAggregate(
            self._round, self.dim, [self._proofs[c] for c in sorted(self._proofs)], self._sum, self._binding
        )
        self.last_completed_round = self._round
        self._round, self._proofs, self._sum = None, {}, None
        return aggregate
