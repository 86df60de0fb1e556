"""A client of the two-server DPF scheme: its item-table rows as bucketed DPF keys, its dense values additively
shared, each server's part sealed to that server, the whole signed.

The client encodes its vector on the grid (:class:`..fixedpoint.FixedPoint`), keeps the table rows
:meth:`.params.DPFParams.sparse` says (its touched rows, at most R), places them by cuckoo hashing and makes one
key pair per bucket (:func:`.sparse.encode`: a zero at a random place for an empty bucket, so every client sends
the same bytes whatever it touched). The dense rest (the MLP, any report coordinates) is split as ``d − p`` for
the aggregator and the seed of the pad ``p`` for the key holder. No noise share: a dense share would touch every
row; the key holder adds the central noise.
"""

from __future__ import annotations

import secrets

import numpy as np

from fedrecgel_secure.errors import BadInputError

from ..fixedpoint import FixedPoint
from ..identity import ClientIdentity, Kind, check_round, check_session_tag
from ..vectors import check_dim, check_upload
from . import wire
from .params import DPFParams
from .sparse import CuckooFailure, KeyArrays, encode

PLACEMENT_TRIES = 8  # cuckoo hashing's evictions are random: another try places an unlucky set


class DPFClient:
    """``seal_keys``: the aggregator's and the key holder's X25519 public keys (raw, 32 bytes each)."""

    def __init__(
        self,
        identity: ClientIdentity,
        dim: int,
        *,
        params: DPFParams,
        encoding: FixedPoint,
        session_tag: bytes,
        seal_keys: tuple[bytes, bytes],
    ) -> None:
        self.identity, self.dim, self.params, self.encoding = identity, check_dim(dim), params, encoding
        self.session_tag = check_session_tag(session_tag)
        if len(seal_keys) != 2 or any(not isinstance(k, bytes) or len(k) != 32 for k in seal_keys):
            raise BadInputError("seal_keys must be the two servers' raw X25519 public keys (32 bytes each)")
        params.check(dim, encoding, 1)
        self.seal_keys = seal_keys
        self.last_clipped = 0
        self.last_dropped_rows = 0

    def upload(
        self, round_idx: int, x: np.ndarray, noise: np.ndarray | None = None, binding: wire.Binding | None = None
    ) -> bytes:
        """The upload of ``x`` (:mod:`.wire`), its envelope signed under ``binding`` (a deployment's: what ``x``
        was computed from) or the session tag alone; sets ``last_clipped`` and ``last_dropped_rows``."""
        check_round(round_idx)
        if noise is not None:
            raise BadInputError(
                "scheme 'dpf' takes no noise shares: a dense share touches every row; the key holder adds central noise"
            )
        cid = self.identity.client_id
        ints, self.last_clipped = self.encoding.encode(check_upload(x, self.dim, cid))
        p, layout = self.params, self.params.layout
        rows, self.last_dropped_rows = p.sparse(ints)
        table = p.to_group(ints[: p.table_values]).reshape(p.rows, p.width)
        for attempt in range(PLACEMENT_TRIES):
            try:
                keys0, keys1 = encode(layout, {int(r): table[r] for r in rows})
                break
            except CuckooFailure:
                if attempt == PLACEMENT_TRIES - 1:
                    raise
        k0, k1 = KeyArrays.of(keys0), KeyArrays.of(keys1)
        dense = p.to_group(ints[p.table_values :])
        pad_seed = secrets.token_bytes(wire.PAD_SEED_BYTES)
        masked = dense - wire.pad(pad_seed, dense.size, p.group)
        boxes = [
            wire.seal(
                self.seal_keys[party],
                plain,
                wire.box_info(self.session_tag, round_idx, cid, party),
            )
            for party, plain in ((0, k0.seeds.tobytes() + masked.tobytes()), (1, k1.seeds.tobytes() + pad_seed))
        ]
        body = wire.pack_body(wire.Corrections.of(k0), dense.size, boxes[0], boxes[1])
        envelope = self.identity.seal(Kind.DPF_UPLOAD, round_idx, body, wire.signing_context(self.session_tag, binding))
        return wire.join_upload(envelope, boxes[0])
