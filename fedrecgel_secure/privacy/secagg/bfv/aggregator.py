"""The BFV aggregator: adds a round's ciphertexts, checking each upload, and never decrypts (threat model: the
package docstring)."""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tenseal as ts

from fedrecgel_secure.errors import BadInputError

from ..errors import Reason, RejectedPayload, RoundSkipped
from ..identity import (
    ContributionProof,
    Envelope,
    IdentityDirectory,
    Kind,
    check_header,
    check_round,
    check_session_tag,
    verify_signature,
)
from ..vectors import check_dim
from .wire import (
    _U32,
    _UPLOAD_HEAD,
    Binding,
    _params_of,
    aggregate_binding,
    aggregate_head,
    decode_upload,
    frame,
    load_context,
    load_vectors,
    max_chunk_bytes,
    n_chunks,
    parse_aggregate,
    read_chunks,
    signing_context,
)

log = logging.getLogger("fedrecgel_secure.secagg")


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


class BFVAggregator:
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
    ) -> BFVAggregator:
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
                kind=Kind.HE_UPLOAD,
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
        """Add a group's partial aggregate (:meth:`BFVGroup.partial`), the one ciphertext a host of several
        clients (a deployment's node) made of its own clients' vectors; returns their ids.

        Each proof is checked as an upload's would be: a known client, this
        round, not yet counted (and in ``cohort``, if given), a valid signature,
        and its digest must be that of this very ciphertext (``bad_signature``
        otherwise): every named client signed exactly what is added. That the
        ciphertext holds their vectors, each with weight one, is what the key
        holder's tags check (:mod:`.tags`). A host that knows its clients'
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
        signed = hashlib.sha256(_UPLOAD_HEAD.pack(b"BFV1", dim, count))  # the group's upload body (BFVGroup.partial)
        signed.update(memoryview(data)[offset:])
        digest = signed.digest()
        context = signing_context(self.session_tag, binding)
        for p in proofs:
            self.directory.verify(context, Kind.HE_UPLOAD, round_idx, p.client_id, p.digest, p.signature)
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
