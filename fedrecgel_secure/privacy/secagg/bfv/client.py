"""A BFV client's upload (BFVClient) and a host's clients encrypted as one group (BFVGroup); the threat model is
the package docstring's."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import tenseal as ts

from fedrecgel_secure.errors import BadInputError

from ..fixedpoint import FixedPoint
from ..identity import (
    ClientIdentity,
    ContributionProof,
    Kind,
    check_round,
    check_session_tag,
)
from ..vectors import check_dim, check_upload
from . import tags
from .wire import (
    _U32,
    _UPLOAD_HEAD,
    Binding,
    _params_of,
    aggregate_head,
    centre_lift,
    encrypt_ints,
    load_context,
    n_chunks,
    signing_context,
)

log = logging.getLogger("fedrecgel_secure.secagg")


class BFVClient:
    """Encodes one client's vector on the grid, tags it, encrypts it with the public context and signs it.

    ``tag_key``: the 64 bytes the key holder gave this client at registration
    (:meth:`.keyholder.KeyHolder.client_key`), over a confidential channel.
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
        if not isinstance(tag_key, (bytes, bytearray)) or len(tag_key) != tags.CLIENT_KEY_BYTES:
            raise BadInputError(f"tag_key must be the {tags.CLIENT_KEY_BYTES} bytes the key holder issued")
        self._pad_key = bytes(tag_key[tags.KEY_BYTES :])
        self._alpha = tags.alpha(
            bytes(tag_key[: tags.KEY_BYTES]),
            n_chunks(dim, self.params),
            self.params.data_slots,
            self.params.plain_modulus,
        )
        self.last_clipped = 0

    def upload(self, round_idx: int, x: np.ndarray, noise: np.ndarray | None = None) -> bytes:
        """Signed envelope of ``x`` (plus its DP ``noise`` share) on the grid, tagged and encrypted."""
        check_round(round_idx)
        body = self.encrypt(round_idx, self.rows(x, noise), [self._pad_key])
        return self.identity.seal(Kind.HE_UPLOAD, round_idx, body, self.session_tag)

    def rows(self, x: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """``x`` (plus its ``noise`` share) on the grid, one zero-padded row per ciphertext; sets ``last_clipped``."""
        x = check_upload(x, self.dim, self.identity.client_id)
        ints, self.last_clipped = self.encoding.encode(x, noise)
        rows = np.zeros(self._alpha.shape[1:], dtype=np.int64)
        rows.reshape(-1)[: self.dim] = ints
        return rows

    def encrypt(self, round_idx: int, rows: np.ndarray, pad_keys: list[bytes]) -> bytes:
        """Upload body of grid ``rows`` (signed, |v| < t/2), each tagged with <α, row> plus the pads of
        ``pad_keys``: this client's alone, or a group's (:class:`BFVGroup`)."""
        t = self.params.plain_modulus
        chunk_tags = [
            (dot + sum(tags.pad(k, self.session_tag, round_idx, c, t) for k in pad_keys)) % t
            for c, dot in enumerate(tags.inner(self._alpha, rows, t))
        ]
        return encrypt_ints(self._ctx, self.params, self.dim, rows, chunk_tags)


class BFVGroup:
    """The clients of one host (a deployment's node) as one contribution: their grid vectors added up, tagged
    with all their pads and encrypted once, every client signing that one ciphertext.

    It decrypts to exactly what the sum of their :class:`BFVClient` uploads
    decrypts to: the data slots hold the same grid sum mod t, and a tag is
    linear in its row with pads that add, so the key holder's checks and its
    release are unchanged (``tests/secagg/test_secagg_he_group.py``). The host
    encrypts one vector instead of one per client (FilmTrust: about 30 users
    a node, 372,737 values each). It sees its clients' vectors anyway, since
    it computes them; the server still sees ciphertexts only, and checks that
    each named client signed exactly this ciphertext
    (:meth:`BFVAggregator.receive_partial`).
    """

    def __init__(self, clients: list[BFVClient]) -> None:
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
        counts the values the grid clipped. A row of None is a zero input (a user of a node under hidden
        participation who was not drawn): it adds nothing to the sum, and its client still tags and signs."""
        check_round(round_idx)
        first, t = self.clients[0], self.clients[0].params.plain_modulus
        total, self.last_clipped = np.zeros(first._alpha.shape[1:], dtype=np.int64), 0
        for i, client in enumerate(self.clients):
            if x[i] is None and (noise is None or noise[i] is None):
                continue
            rows = client.rows(x[i], None if noise is None else noise[i]) % t  # in [0, t): no int64 overflow
            total = (total + rows) % t
            self.last_clipped += client.last_clipped
        body = first.encrypt(round_idx, centre_lift(total, t), [c._pad_key for c in self.clients])
        digest = hashlib.sha256(body).digest()
        signed = sorted(self.clients, key=lambda c: c.identity.client_id)
        proofs = [
            ContributionProof(
                c.identity.client_id,
                digest,
                c.identity.sign(Kind.HE_UPLOAD, round_idx, digest, signing_context(c.session_tag, binding)),
            )
            for c in signed
        ]
        head = aggregate_head(round_idx, first.dim, len(proofs), binding)
        # the body's chunk count and ciphertexts are the aggregate's tail, byte for byte
        return head + b"".join(p.to_bytes() for p in proofs) + body[_UPLOAD_HEAD.size - _U32.size :]
