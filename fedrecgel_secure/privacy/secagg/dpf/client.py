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
from ..vectors import check_dim, check_upload, check_vector
from . import group as group_ops
from . import wire
from .params import DPFParams
from .sparse import KeyArrays, encode_placed


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
        if seal_keys[0] == seal_keys[1]:  # one server could open both boxes: it would hold both keys of every pair
            raise BadInputError("seal_keys: the aggregator and the key holder must have different sealing keys")
        params.check(dim, encoding, 1)
        self.norm = params.norm_check(encoding, dim)
        self.seal_keys = seal_keys
        self.last_clipped = 0
        self.last_dropped_rows = 0

    def upload(
        self, round_idx: int, x: np.ndarray, noise: np.ndarray | None = None, binding: wire.Binding | None = None
    ) -> bytes:
        """The upload of the vector ``x`` (:mod:`.wire`): its nonzero table rows and its dense rest
        (:meth:`upload_rows`), its envelope signed under ``binding`` (a deployment's: what ``x`` was computed from)
        or the session tag alone; sets ``last_clipped`` and ``last_dropped_rows``."""
        if noise is not None:
            raise BadInputError(
                "scheme 'dpf' takes no noise shares: a dense share touches every row; the key holder adds central noise"
            )
        p = self.params
        x = check_upload(x, self.dim, self.identity.client_id)
        table = x[: p.table_values].reshape(p.rows, p.width)
        touched = np.flatnonzero(table.any(axis=1))
        return self.upload_rows(round_idx, touched, table[touched], x[p.table_values :], binding)

    def upload_rows(
        self,
        round_idx: int,
        rows: np.ndarray,
        values: np.ndarray,
        dense: np.ndarray,
        binding: wire.Binding | None = None,
    ) -> bytes:
        """The upload of a vector given by its table ``rows`` (distinct ids; the rest of the table is zero), their
        ``values`` (len(rows), width) and its ``dense`` rest: what a client of a large catalogue holds, never the
        whole table. The same bytes' worth as :meth:`upload` of the dense vector (the grid encodes a zero as 0)."""
        check_round(round_idx)
        p, cid = self.params, self.identity.client_id
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        values = check_vector(np.asarray(values).reshape(-1), rows.size * p.width, f"row values of client {cid}")
        dense = check_vector(dense, self.dim - p.table_values, f"dense values of client {cid}")
        if np.unique(rows).size != rows.size or np.any(rows < 0) or np.any(rows >= p.rows):
            raise BadInputError(f"the rows of client {cid} must be distinct ids of the table's {p.rows} rows")
        row_ints, clipped = self.encoding.encode(values)
        dense_ints, dense_clipped = self.encoding.encode(dense)
        self.last_clipped = clipped + dense_clipped
        row_ints = row_ints.reshape(rows.size, p.width)
        kept, self.last_dropped_rows = p.choose(rows, row_ints)
        by_row = dict(zip(rows.tolist(), row_ints, strict=True))
        placed = p.layout.place(sorted(int(r) for r in kept))
        keys0, keys1 = encode_placed(p.layout, placed, {b: p.to_group(by_row[r]) for b, r in placed.items()})
        checked = None
        if self.norm is not None:  # the vector the servers hold shares of: each bucket's row, then the dense rest
            buckets = np.zeros((p.layout.buckets, p.width), dtype=np.int64)
            for b, r in placed.items():
                buckets[b] = by_row[r]
            checked = np.concatenate([buckets.reshape(-1), dense_ints.astype(np.int64)])
        dense = p.to_group(dense_ints)
        return self.pack(round_idx, KeyArrays.of(keys0), KeyArrays.of(keys1), dense, binding, checked)

    def pack(
        self,
        round_idx: int,
        k0: KeyArrays,
        k1: KeyArrays,
        dense: np.ndarray,
        binding: wire.Binding | None = None,
        checked: np.ndarray | None = None,
    ) -> bytes:
        """The signed upload of key batches ``k0`` (the aggregator's) and ``k1`` (the key holder's) and the dense
        values (in the group), which it splits between the two servers; with the norm check, the proof that
        ``checked`` (the grid integers the servers hold shares of) is within the bound, in a second box for the
        aggregator and two seeds in the key holder's (:mod:`.norm`)."""
        cid, group = self.identity.client_id, self.params.group
        pad_seed = secrets.token_bytes(wire.PAD_SEED_BYTES)
        masked = group_ops.sub(dense, wire.pad(pad_seed, dense.size, group)).astype(f"<u{np.dtype(group).itemsize}")
        norm_seeds = b"" if self.norm is None else self.norm.key_holder_seeds()
        boxes = [
            wire.seal(self.seal_keys[party], plain, wire.box_info(self.session_tag, round_idx, cid, party))
            for party, plain in (
                (0, k0.seeds.tobytes() + masked.tobytes()),
                (1, k1.seeds.tobytes() + pad_seed + norm_seeds),
            )
        ]
        body = wire.pack_body(wire.Corrections.of(k0), dense.size, boxes[0], boxes[1])
        second = None
        if self.norm is not None:
            if checked is None:
                raise BadInputError("a checked upload needs the integers it proves the norm of")
            c1 = self.norm.commitment(self.session_tag, round_idx, cid, body)
            part, h_bits = self.norm.prove(checked, c1, norm_seeds)
            second = wire.seal(self.seal_keys[0], part, wire.box_info(self.session_tag, round_idx, cid, wire.PROOF_BOX))
            body += wire.check_section(h_bits, second)
        envelope = self.identity.seal(Kind.DPF_UPLOAD, round_idx, body, wire.signing_context(self.session_tag, binding))
        return wire.join_upload(envelope, boxes[0], second)
