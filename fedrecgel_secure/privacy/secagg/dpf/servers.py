"""The two servers of the DPF scheme: the aggregator (party 0) and the key holder (party 1), which do not collude.

Each opens its box of every upload as it comes, then expands the round's clients' keys over the whole table together
(:func:`.sparse.add_client`; on a GPU :func:`.expand_torch.add_clients`, many clients a batch) into its share of
the sum, and keeps each client's digest of leaf proofs. A round::

    aggregator                                   key holder
    receive(upload) for each client
    finish() -> expands; request: the
                envelopes and its digests   ->   check(request): opens its boxes, expands, compares
                                                 digests -> answer: its digests (or refusals)
    settle(answer) -> contributors: both
                servers accepted the client
                and their digests agree
    (the caller's admit check)
                                                 release(noise) -> its share of the contributors' sum,
                                                 plus the central noise on the grid, once per round
    combine(share) -> the round's grid sum

A deployment binds the round (``begin_round(round_idx, binding)``): its request states the :class:`.wire.Binding`
every envelope must verify under, so users sent different models are never summed together. There the key holder
is a node of its own, each message a fresh process: it keeps its sealing key and its record on disk, hands the
checked share from :meth:`DPFKeyHolder.check` to :meth:`DPFKeyHolder.release_share` through its own disk
(:meth:`DPFKeyHolder.pending`), and constructs each server with ``seal_key`` and ``last_completed_round``
(:mod:`fedrecgel_secure.deploy.node.dpf_node`).

A client whose two digests differ sent keys that are not point functions (:mod:`.point`, the verifiable DPF's
check) and is left out by both servers, as is one either server refused (signature, round, layout, box). Neither
server sees a row index or a value: each holds one key of every pair and a pad or a padded value of every dense
coordinate; the digests they compare are equal for every honest client. Threat model: both servers follow the
protocol and do not collude (honest-but-curious, like the BFV key holder and aggregator); any number of clients
may be malicious, and what one can do is in :mod:`.` (the package's docstring).
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from fedrecgel_secure.errors import BadInputError, ProtocolStateError

from ..errors import Reason, RejectedPayload, RoundSkipped
from ..fixedpoint import FixedPoint
from ..identity import Envelope, IdentityDirectory, Kind, authenticate, check_round, check_session_tag
from ..vectors import check_dim
from . import expand_torch, wire
from . import group as group_ops
from .expand_torch import device_for
from .norm import SEED_BYTES as NORM_SEED_BYTES
from .params import DPFParams
from .prg import SEED_BYTES
from .sparse import add_client

log = logging.getLogger("fedrecgel_secure.secagg")


class _Server:
    party: int

    def __init__(
        self,
        directory: IdentityDirectory,
        *,
        params: DPFParams,
        dim: int,
        min_clients: int,
        session_tag: bytes,
        encoding: FixedPoint = FixedPoint(),
        seal_key: bytes | None = None,
        last_completed_round: int = -1,
    ) -> None:
        """``seal_key``: the raw private sealing key of a server that keeps it (a fresh one by default);
        ``last_completed_round``: the last round it completed, from its own record (rounds only move forward).
        It expands keys where ``params.device`` says (:func:`.expand_torch.device_for`)."""
        if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
            raise BadInputError(f"min_clients must be an integer >= 1, got {min_clients!r}")
        self.directory, self.params, self.dim, self.min_clients = directory, params, check_dim(dim), min_clients
        self.session_tag, self.encoding = check_session_tag(session_tag), encoding
        params.check(dim, encoding, max(len(directory), 1))
        # the sealing key: made here (or kept on the server's own disk), never sent
        self._key = X25519PrivateKey.generate() if seal_key is None else X25519PrivateKey.from_private_bytes(seal_key)
        self.last_completed_round = last_completed_round
        # a torch device, or None: numpy; the paths give the same bits, so either server may run either
        self.device = device_for(params.device)
        self.norm = params.norm_check(encoding, dim)  # the uploads' norm proof, or None (:mod:`.norm`)
        if self.norm is not None and self.device is not None:
            raise BadInputError(
                "privacy.secure_aggregation.dpf.device: the norm check adds up each bucket's leaves on the CPU;"
                " set device = 'cpu' (or norm_check = false)"
            )
        self._round: int | None = None

    @property
    def seal_key(self) -> bytes:
        """The public half of this server's sealing key, which clients seal its box to."""
        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def _begin(self, round_idx: int, binding: wire.Binding | None = None) -> None:
        check_round(round_idx)
        if round_idx <= self.last_completed_round:
            raise RejectedPayload(
                Reason.REPLAY, f"round {round_idx} is at or before completed round {self.last_completed_round}"
            )
        self._round, self.binding = round_idx, binding
        self._context = wire.signing_context(self.session_tag, binding)  # what every envelope is signed under
        self._table = self._zeros()
        self._dense = np.zeros(self.dim - self.params.table_values, dtype=self.params.group)
        self._held: dict[int, tuple] = {}  # client -> (its keys, its dense share): to take it out again
        self._queued: list[int] = []  # accepted clients whose keys wait for :meth:`_expand`
        self.digests: dict[int, bytes] = {}
        self._pending: list[int] | None = None  # the key holder's checked clients, until it releases
        self._proofs: dict[int, tuple] = {}  # client -> (C1, h_bits, its bits share, its proof share): the norm check
        self._rows: dict[int, np.ndarray] = {}  # client -> this server's share of each bucket's row

    def _accept(self, envelope: bytes, aggregator_box: bytes | None) -> int:
        """Authenticate one client's envelope, open this server's box, add its dense share and queue its keys."""
        if self._round is None:
            raise ProtocolStateError("a round must begin before uploads arrive")
        env = authenticate(
            Envelope.parse(envelope),
            directory=self.directory,
            kind=Kind.DPF_UPLOAD,
            round_idx=self._round,
            completed_round=self.last_completed_round,
            context=self._context,
        )
        cid = env.client_id
        if cid in self._held:
            raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already contributed this round", cid)
        p, layout, norm = self.params, self.params.layout, self.norm
        dense = self.dim - p.table_values
        expect = (layout.buckets, layout.depth, layout.width, dense, p.group)
        body = wire.parse_body(env.body, cid, expect, checked=norm is not None)
        if self.party == 0:
            if aggregator_box is None:
                raise RejectedPayload(Reason.BAD_SIGNATURE, "the aggregator's box is missing", cid)
            box, second = wire.split_boxes(aggregator_box, norm is not None, cid)
            if hashlib.sha256(box).digest() != body.aggregator_box_digest or (
                second is not None and hashlib.sha256(second).digest() != body.check[1]
            ):
                raise RejectedPayload(Reason.BAD_SIGNATURE, "the aggregator's box is not the one signed for", cid)
            rest = dense * np.dtype(p.group).itemsize
        else:
            box, rest = body.key_holder_box, wire.PAD_SEED_BYTES + (0 if norm is None else 2 * NORM_SEED_BYTES)
        roots_len = layout.buckets * SEED_BYTES
        plain = wire.open_box(
            self._key, box, wire.box_info(self.session_tag, self._round, cid, self.party), roots_len + rest, cid
        )
        roots = np.frombuffer(plain[:roots_len], dtype=np.uint8).reshape(layout.buckets, SEED_BYTES)
        if self.party == 0:
            share = np.frombuffer(plain[roots_len:], dtype=f"<u{np.dtype(p.group).itemsize}").astype(p.group)
            group_ops.check(share, "the aggregator's dense share", cid)
        else:
            share = wire.pad(plain[roots_len : roots_len + wire.PAD_SEED_BYTES], dense, p.group)
        if norm is not None:  # this server's shares of the norm's bits and of its proof
            if self.party == 0:
                info = wire.box_info(self.session_tag, self._round, cid, wire.PROOF_BOX)
                part = wire.open_box(self._key, second, info, norm.aggregator_part_bytes(), cid)
            else:
                part = plain[roots_len + wire.PAD_SEED_BYTES :]
            c1 = norm.commitment(self.session_tag, self._round, cid, body.committed)
            self._proofs[cid] = (c1, body.check[0], *norm.shares_of(self.party, part, body.check[0], cid))
        self._dense = group_ops.add(self._dense, share)
        self._held[cid] = (body.corrections.keys(self.party, roots), share)
        self._queued.append(cid)
        return cid

    def _expand(self) -> None:
        """Expand the queued clients' keys into this server's share and keep their digests: the round's clients
        together, which a GPU takes many at a time (:func:`.expand_torch.add_clients`); with the norm check, each
        client's bucket sums too (on the CPU)."""
        queued, self._queued = self._queued, []
        if self.norm is None:
            self.digests.update(zip(queued, self._add([self._held[c][0] for c in queued], self._table)))
            return
        layout = self.params.layout
        for cid in queued:
            rows = np.zeros((layout.buckets, layout.width), dtype=layout.group)
            self.digests[cid] = add_client(layout, self._held[cid][0], self._table, rows)
            self._rows[cid] = rows

    def _verifier_share(self, cid: int, t: int) -> np.ndarray:
        """This server's share of ``cid``'s verifier message at the query point ``t`` (:mod:`.norm`)."""
        c1, h_bits, bits, proof = self._proofs[cid]
        x_share = np.concatenate([self._rows[cid].reshape(-1), self._held[cid][1]])
        return self.norm.verifier_share(x_share, bits, proof, c1, h_bits, t)

    def _drop(self, clients) -> None:
        """Take ``clients``' contributions out of this server's share again."""
        for cid in clients:
            keys, share = self._held.pop(cid)
            if cid in self._queued:  # not expanded yet: nothing of its keys is in the table
                self._queued.remove(cid)
            else:
                alone = self._zeros()
                self._add([keys], alone)
                self._table = self._subtract(self._table, alone)
            self._dense = group_ops.sub(self._dense, share)
            self.digests.pop(cid, None)
            self._proofs.pop(cid, None)
            self._rows.pop(cid, None)

    def _zeros(self):
        """A zero share of the item table where this server expands keys."""
        layout = self.params.layout
        if self.device is None:
            return np.zeros((layout.rows, layout.width), dtype=layout.group)
        return expand_torch.new_table(layout, self.device)

    def _add(self, clients, table) -> list[bytes]:
        """Expand each of ``clients``' keys into ``table`` (from :meth:`_zeros`); their digests."""
        if self.device is None:
            return [add_client(self.params.layout, keys, table) for keys in clients]
        return expand_torch.add_clients(self.params.layout, clients, table)

    def _subtract(self, table, alone):
        """``table`` less ``alone``, both from :meth:`_zeros`, where this server expands keys."""
        if self.device is None:
            return group_ops.sub(table, alone)
        return expand_torch.subtract(table, alone)

    def _share(self) -> np.ndarray:
        table = self._table if self.device is None else expand_torch.to_group(self._table, self.params.group)
        return np.concatenate([table.reshape(-1), self._dense])


class DPFAggregator(_Server):
    """Party 0: receives the uploads, forwards the envelopes to the key holder and adds the two shares."""

    party = 0
    _phase: str | None = None  # receiving, finished, settled; None between rounds

    def begin_round(self, round_idx: int, binding: wire.Binding | None = None) -> None:
        """Round ``round_idx`` begins; with ``binding`` (a deployment's) every upload must be signed under it."""
        self._begin(round_idx, binding)
        self._envelopes: dict[int, bytes] = {}
        self.refused: dict[int, str] = {}  # the key holder's refusals and the clients whose digests differed
        self._phase = "receiving"

    def _in(self, phase: str, then: str | None = None) -> None:
        """Refuse a step out of the round's order (receiving, finished, settled): an upload that arrives after
        the request went to the key holder is in no share of the key holder's, so it must not enter this one."""
        if getattr(self, "_phase", None) != phase:
            raise RejectedPayload(
                Reason.OUT_OF_PHASE, f"the round is not {phase} (it is {getattr(self, '_phase', None)})"
            )
        if then is not None:
            self._phase = then

    def receive(self, payload: bytes) -> int:
        """Check one upload and add this server's share of it; returns the client id."""
        self._in("receiving")
        envelope, box = wire.split_upload(payload)
        try:
            cid = self._accept(envelope, box)
        except RejectedPayload as exc:
            log.warning("round %s: rejected DPF upload from %s: %s", self._round, exc.client_id, exc)
            raise
        self._envelopes[cid] = envelope
        return cid

    def finish(self) -> bytes:
        """The key holder's request: every accepted envelope with this server's digest of it."""
        self._in("receiving")
        if len(self._envelopes) < self.min_clients:
            raise RoundSkipped.too_few_clients(self._round, len(self._envelopes), "valid uploads", self.min_clients)
        self._phase = "finished"
        self._expand()
        items = [(c, e, self.digests[c]) for c, e in sorted(self._envelopes.items())]
        check = None
        if self.norm is not None:  # t drawn now, after every upload of the round is fixed
            t = self.norm.query_point()
            check = (t, {c: self._verifier_share(c, t).astype("<u8").tobytes() for c, _, _ in items})
        return wire.pack_request(self._round, items, self.binding, check)  # the binding the key holder verifies under

    def settle(self, answer: bytes) -> list[int]:
        """The contributors, from the key holder's answer: the clients both servers accepted whose digests agree;
        the others are taken out of this server's share and named in ``refused``."""
        self._in("finished", then="settled")
        theirs = wire.parse_answer(answer, self._round)
        for cid in sorted(self._held):
            if cid not in theirs:
                self.refused[cid] = "key_holder_missing"
            elif isinstance(theirs[cid], str):
                self.refused[cid] = theirs[cid]
            elif theirs[cid] != self.digests[cid]:
                self.refused[cid] = Reason.NOT_A_POINT.value
        self._drop(self.refused)
        contributors = sorted(self._held)
        if len(contributors) < self.min_clients:
            raise RoundSkipped.too_few_clients(self._round, len(contributors), "checked uploads", self.min_clients)
        return contributors

    def combine(self, share: bytes) -> np.ndarray:
        """The round's sum on the grid (signed int64): this server's share plus the key holder's."""
        self._in("settled")
        size = np.dtype(self.params.group).itemsize
        if len(share) != self.dim * size:
            raise RejectedPayload(Reason.WRONG_SHAPE, "the key holder's share is not of this vector's length")
        theirs = group_ops.check(
            np.frombuffer(share, dtype=f"<u{size}").astype(self.params.group), "the key holder's share"
        )
        total = self.params.from_group(group_ops.add(self._share(), theirs))
        self.last_completed_round, self._round, self._phase = self._round, None, None
        return total


class DPFKeyHolder(_Server):
    """Party 1: checks the aggregator's request, compares digests, and releases its noised share once a round."""

    party = 1

    def check(self, request: bytes) -> bytes:
        """Evaluate every envelope of the request; answer with this server's digest of each (or its refusal)."""
        verifier_bytes = 0 if self.norm is None else 8 * self.norm.verifier_len()
        # the whole request, checked before anything is added
        round_idx, binding, items, check = wire.parse_checked_request(request, verifier_bytes)
        if check is not None:
            self.norm.check_point(check[0])
        self._begin(round_idx, binding)
        theirs: dict[int, bytes] = {}
        answers: dict[int, bytes | str] = {}
        for cid, envelope, digest in items:
            try:
                got = self._accept(envelope, None)
            except RejectedPayload as exc:
                answers[cid] = exc.reason.value
                continue
            if got != cid:  # an envelope listed under another client: neither counts
                self._drop([got])
                answers[cid] = Reason.GARBAGE.value
                continue
            theirs[cid] = digest
        self._expand()
        if check is not None:  # the norm proofs of the clients whose keys are point functions
            t, shares = check
            for cid in [c for c in theirs if theirs[c] == self.digests[c]]:
                aggregator = np.frombuffer(shares[cid], dtype="<u8").astype(np.uint64)
                if bool((aggregator >= group_ops.P).any()) or not self.norm.decide(
                    self._verifier_share(cid, t), aggregator
                ):
                    answers[cid] = Reason.OVER_BOUND.value
                    del theirs[cid]
        answers.update((cid, self.digests[cid]) for cid in theirs)
        self._drop([c for c in self._held if theirs.get(c) != self.digests[c]])
        self._pending = sorted(self._held)
        return wire.pack_answer(round_idx, answers)

    def release(self, noise: np.ndarray | None = None) -> bytes:
        """This server's share of the checked clients' sum, plus ``noise`` on the grid; once per round."""
        if self._round is None or self._pending is None or self._pending != sorted(self._held):
            raise ProtocolStateError("release() comes after a whole check() of the same round")
        if len(self._pending) < self.min_clients:
            raise RoundSkipped.too_few_clients(self._round, len(self._pending), "checked uploads", self.min_clients)
        share = self.release_share(self._share(), noise)
        self.last_completed_round, self._round, self._pending = self._round, None, None
        return share

    def pending(self) -> tuple[int, list[int], np.ndarray]:
        """The round :meth:`check` examined, the clients it kept and this server's share of their sum (in the
        group): what a key holder that releases in another process keeps until then (:meth:`release_share`).
        Secret: with the aggregator's share it is the round's exact sum, without its noise."""
        if self._round is None or self._pending is None or self._pending != sorted(self._held):
            raise ProtocolStateError("pending() comes after a whole check()")
        return self._round, list(self._pending), self._share()

    def release_share(self, share: np.ndarray, noise: np.ndarray | None = None) -> bytes:
        """``share`` (this server's share of a checked sum, in the group) plus ``noise`` on the grid, as the bytes
        the aggregator combines. The caller releases once per round (:meth:`release` does)."""
        if noise is not None:
            share = group_ops.add(share, self.params.to_group(self.encoding.encode_noise(noise).astype(np.int64)))
        return share.astype(f"<u{share.dtype.itemsize}").tobytes()
