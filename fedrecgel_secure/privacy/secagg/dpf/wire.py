"""What a client of the two-server DPF scheme sends, byte for byte, and how each server opens its part.

An upload is the client's signed envelope (:mod:`..identity`, kind ``DPF_UPLOAD``) followed by the aggregator's
box::

    u32 envelope length ‖ envelope ‖ aggregator's box

With the norm check the aggregator's part is ``u32 first box's length ‖ first box ‖ second box``.

The envelope's body::

    offset  size        field
    0       4           magic b"DPFU"
    4       1           version (1)
    5       1           bytes a value (4: Z_2^32, 8: Field64)
    6       2           reserved, 0
    8       4           buckets B
    12      4           depth d
    16      4           width w
    20      4           dense values m
    24      32          SHA-256 of the aggregator's box
    56      4           key holder's box length L
    60      L           key holder's box
    ...     B·d·16      correction seeds     } both servers' keys share these: sent once,
            B·d         control-bit words    } in bucket order (each key's :class:`.point.DPFKey`
            B·32        check words          } less its root seed)
            B·w·size    value words          }
    with the norm check (:mod:`.norm`), then:
            32          h_bits: the blinded hash of the aggregator's share of the norm's bits
            32          SHA-256 of the aggregator's second box (its shares of those bits and of the proof)

The norm check's commitment C1 is a hash of the body before those 64 bytes.

A deployment's client signs its envelope under a :class:`Binding` (what it computed its vector from), the
simulator's under the session tag alone.

A box is HPKE (RFC 9180: X25519, HKDF-SHA256, AES-128-GCM) to that server's sealing key, its ``info`` naming the
session, the round, the client and the party, so a box opens only where and when it was made for. The
aggregator's holds its B root seeds and the dense part less a pad (m values); the key holder's its B root seeds
and the 16-byte seed of that pad (AES-CTR, :func:`pad`). Neither box alone says anything of the vector. The
signature covers the whole body, the aggregator's box by its hash, so the aggregator forwards the envelope
alone and the key holder checks the same signature over the same bytes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ..errors import Reason, RejectedPayload
from .group import EXTRA_WORDS, FIELD, P, check
from .prg import CHECK_BYTES, SEED_BYTES
from .sparse import KeyArrays

MAGIC = b"DPFU"
VERSION = 2  # 2: 8-byte values are Field64's (1: Z_2^64's)
_HEAD = struct.Struct(">4sBBHIIII32sI")
_LEN = struct.Struct(">I")
_REQUEST = struct.Struct(">4sQI")  # magic, round, clients
_ITEM = struct.Struct(">II")  # client, envelope length
_ANSWER = struct.Struct(">4sQI")
_ANSWER_ITEM = struct.Struct(">IB")  # client, 0: a digest follows, 1: a refusal (u16 length, reason)
DIGEST_BYTES = 32
PAD_SEED_BYTES = 16
PROOF_BOX = 2  # the party code of the aggregator's second box (the norm check's shares) in its info
_INFO = b"fedrecgel/dpf-box/v1\x00"
_BINDING = struct.Struct(">32sBd")  # digest, whether a clip norm is stated, the clip norm (0.0 when not)


def suite():
    from cryptography.hazmat.primitives import hpke

    return hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)


def box_info(session_tag: bytes, round_idx: int, client_id: int, party: int) -> bytes:
    return _INFO + struct.pack(">H", len(session_tag)) + session_tag + struct.pack(">QIB", round_idx, client_id, party)


@dataclass(frozen=True)
class Binding:
    """What a deployment's users computed their uploads from, which each signs its envelope over.

    ``digest``: SHA-256 of the model and DP settings their node was sent
    (:func:`~fedrecgel_secure.deploy.messages.train_binding`), so that uploads made for different models are
    never summed together (both servers verify every envelope of a round under the one binding the aggregator's
    request states); ``clip_norm``: the C they clipped to (None without DP), stated beside the digest because the
    key holder, which holds no model and cannot recompute the digest, sizes the central noise with a C of its
    own and must hold the users to it (:class:`~fedrecgel_secure.deploy.node.dpf_node.DPFKeyHolderNode`).
    """

    digest: bytes
    clip_norm: float | None = None

    def to_bytes(self) -> bytes:
        if len(self.digest) != 32:
            raise ValueError("a binding's digest is SHA-256: 32 bytes")
        stated = self.clip_norm is not None
        return _BINDING.pack(self.digest, int(stated), float(self.clip_norm) if stated else 0.0)

    @classmethod
    def from_bytes(cls, data: bytes) -> Binding:
        if len(data) != _BINDING.size:
            raise RejectedPayload(Reason.TRUNCATED, "a DPF binding of the wrong length")
        digest, stated, clip_norm = _BINDING.unpack(data)
        if stated not in (0, 1) or (stated and not np.isfinite(clip_norm)):
            raise RejectedPayload(Reason.GARBAGE, "a malformed DPF binding")
        return cls(digest, clip_norm if stated else None)

    def context(self, session_tag: bytes) -> bytes:
        """The signature context of an upload under this binding: the session tag, then the binding's hash."""
        return session_tag + hashlib.sha256(b"fedrecgel/dpf-binding/v1" + self.to_bytes()).digest()


BINDING_BYTES = _BINDING.size


def signing_context(session_tag: bytes, binding: Binding | None) -> bytes:
    """What an upload's envelope is signed under: the binding's context, or the session tag when unbound."""
    return session_tag if binding is None else binding.context(session_tag)


def pad(seed: bytes, count: int, group: type) -> np.ndarray:
    """``count`` pseudorandom elements of the group from a 16-byte seed: AES-128-CTR from a zero counter, its words
    in order, skipping any at or past Field64's p (:mod:`.group`: so the pad is uniform)."""
    size = np.dtype(group).itemsize
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    out = np.zeros(0, dtype=group)
    while out.size < count:  # Field64 skips a word 2^-32 of the time: a second pass is all but never needed
        words = np.frombuffer(encryptor.update(bytes((count - out.size + EXTRA_WORDS) * size)), dtype=f"<u{size}")
        words = words.astype(group)
        out = np.concatenate([out, words[words < P] if group is FIELD else words])
    return out[:count]


@dataclass(frozen=True, eq=False)
class Corrections:
    """What both servers' keys of one client share, bucket by bucket."""

    cw_seeds: np.ndarray  # (B, d, 16) uint8
    cw_bits: np.ndarray  # (B, d, 2) uint8
    cw_check: np.ndarray  # (B, 32) uint8
    cw_value: np.ndarray  # (B, w) of the group

    @classmethod
    def of(cls, keys: KeyArrays) -> Corrections:
        return cls(keys.cw_seeds, keys.cw_bits, keys.cw_check, keys.cw_value)

    def keys(self, party: int, roots: np.ndarray) -> KeyArrays:
        return KeyArrays(party, roots, self.cw_seeds, self.cw_bits, self.cw_value, self.cw_check)

    def to_bytes(self) -> bytes:
        packed = (self.cw_bits[..., 0] | (self.cw_bits[..., 1] << 1)).astype(np.uint8)
        size = self.cw_value.dtype.itemsize
        parts = (self.cw_seeds, packed, self.cw_check, self.cw_value.astype(f"<u{size}"))
        return b"".join(p.tobytes() for p in parts)


@dataclass(frozen=True)
class Body:
    """A parsed envelope body: the shape, the two boxes' handles and the shared corrections."""

    buckets: int
    depth: int
    width: int
    dense: int
    group: type
    aggregator_box_digest: bytes
    key_holder_box: bytes
    corrections: Corrections
    committed: bytes = b""  # the body before the norm check's fields: what C1 hashes
    check: tuple[bytes, bytes] | None = None  # (h_bits, the aggregator's second box's SHA-256)


CHECK_BYTES_IN_BODY = 64


def check_section(h_bits: bytes, second_box: bytes) -> bytes:
    """The norm check's fields at the end of a body (:mod:`.norm`)."""
    return h_bits + hashlib.sha256(second_box).digest()


def pack_body(corrections: Corrections, dense: int, aggregator_box: bytes, key_holder_box: bytes) -> bytes:
    buckets, depth = corrections.cw_seeds.shape[:2]
    width, size = corrections.cw_value.shape[1], corrections.cw_value.dtype.itemsize
    head = _HEAD.pack(
        MAGIC,
        VERSION,
        size,
        0,
        buckets,
        depth,
        width,
        dense,
        hashlib.sha256(aggregator_box).digest(),
        len(key_holder_box),
    )
    return head + key_holder_box + corrections.to_bytes()


def parse_body(
    data: bytes | memoryview, client_id: int, expect: tuple[int, int, int, int, type], checked: bool = False
) -> Body:
    """The body of ``client_id``'s envelope, checked against the session's (buckets, depth, width, dense, group)
    and whether it carries the norm check's fields; anything else is :class:`RejectedPayload`."""
    norm_fields = None
    if checked:
        if len(data) < _HEAD.size + CHECK_BYTES_IN_BODY:
            raise RejectedPayload(Reason.TRUNCATED, "a DPF upload without its norm check's fields", client_id)
        tail = bytes(data[len(data) - CHECK_BYTES_IN_BODY :])
        norm_fields, data = (tail[:32], tail[32:]), data[: len(data) - CHECK_BYTES_IN_BODY]
    if len(data) < _HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF upload shorter than its header", client_id)
    magic, version, size, reserved, buckets, depth, width, dense, box_digest, box_len = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION or reserved:
        raise RejectedPayload(Reason.GARBAGE, "not a DPF upload (magic, version)", client_id)
    group = {4: np.uint32, 8: np.uint64}.get(size)
    if (buckets, depth, width, dense, group) != expect:
        raise RejectedPayload(Reason.WRONG_PARAMS, "a DPF upload of another layout, width or group", client_id)
    corrections_len = buckets * (depth * (SEED_BYTES + 1) + CHECK_BYTES + width * size)
    if len(data) != _HEAD.size + box_len + corrections_len:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"a DPF upload of {len(data)} bytes for its header", client_id)
    buf = np.frombuffer(data, dtype=np.uint8, offset=_HEAD.size + box_len)
    box = bytes(data[_HEAD.size : _HEAD.size + box_len])
    sizes = (buckets * depth * SEED_BYTES, buckets * depth, buckets * CHECK_BYTES)
    cw_seeds = buf[: sizes[0]].reshape(buckets, depth, SEED_BYTES)
    packed = buf[sizes[0] : sizes[0] + sizes[1]].reshape(buckets, depth)
    cw_check = buf[sizes[0] + sizes[1] : sum(sizes)].reshape(buckets, CHECK_BYTES)
    if np.any(packed > 3):
        raise RejectedPayload(Reason.GARBAGE, "a DPF key's control-bit corrections use more than two bits", client_id)
    cw_bits = np.stack([packed & 1, packed >> 1], axis=-1).astype(np.uint8)
    cw_value = buf[sum(sizes) :].view(f"<u{size}").astype(group).reshape(buckets, width)
    check(cw_value, "a DPF upload's value corrections", client_id)
    corrections = Corrections(cw_seeds, cw_bits, cw_check, cw_value)
    return Body(buckets, depth, width, dense, group, box_digest, box, corrections, bytes(data), norm_fields)


def join_upload(envelope: bytes, aggregator_box: bytes, second_box: bytes | None = None) -> bytes:
    """An upload: the envelope, then the aggregator's box (and with the norm check its second box)."""
    if second_box is None:
        return _LEN.pack(len(envelope)) + envelope + aggregator_box
    return _LEN.pack(len(envelope)) + envelope + _LEN.pack(len(aggregator_box)) + aggregator_box + second_box


def split_boxes(part: bytes, checked: bool, client_id: int) -> tuple[bytes, bytes | None]:
    """The aggregator's part of an upload as (its box, its second box or None without the norm check)."""
    if not checked:
        return part, None
    if len(part) < _LEN.size:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF upload without its second box", client_id)
    (n,) = _LEN.unpack_from(part)
    if len(part) < _LEN.size + n:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF upload's first box cut short", client_id)
    return part[_LEN.size : _LEN.size + n], part[_LEN.size + n :]


def split_upload(payload: bytes, client_id: int | None = None) -> tuple[bytes, bytes]:
    """(envelope, aggregator's box) of an upload."""
    if len(payload) < _LEN.size:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF upload shorter than its length field", client_id)
    (n,) = _LEN.unpack_from(payload)
    if len(payload) < _LEN.size + n:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF upload shorter than its envelope", client_id)
    return bytes(payload[_LEN.size : _LEN.size + n]), bytes(payload[_LEN.size + n :])


def seal(public_key: bytes, plaintext: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    return suite().encrypt(plaintext, X25519PublicKey.from_public_bytes(public_key), info=info)


def open_box(private_key, box: bytes, info: bytes, length: int, client_id: int) -> bytes:
    """The plaintext of a box sealed to ``private_key`` under ``info``, of ``length`` bytes, or a refusal."""
    try:
        plain = suite().decrypt(box, private_key, info=info)
    except Exception:  # cryptography raises InvalidTag, or ValueError on a malformed encapsulation
        raise RejectedPayload(Reason.BAD_CIPHERTEXT, "a box that does not open for this server", client_id) from None
    if len(plain) != length:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"a DPF box of {len(plain)} bytes, expected {length}", client_id)
    return plain


def pack_request(
    round_idx: int,
    items: list[tuple[int, bytes, bytes]],
    binding: Binding | None = None,
    check: tuple[int, dict[int, bytes]] | None = None,
) -> bytes:
    """The aggregator's request to the key holder: (client, its envelope, the aggregator's digest) in id order,
    after the round's binding where it has one (magic ``DPFB``; ``DPFQ`` unbound); with the norm check, the query
    point t after the header and each client's verifier share after its digest (:mod:`.norm`)."""
    if binding is None:
        parts = [_REQUEST.pack(b"DPFQ", round_idx, len(items))]
    else:
        parts = [_REQUEST.pack(b"DPFB", round_idx, len(items)), binding.to_bytes()]
    if check is not None:
        parts.append(check[0].to_bytes(8, "little"))
    for cid, envelope, digest in items:
        parts += [_ITEM.pack(cid, len(envelope)), envelope, digest]
        if check is not None:
            parts.append(check[1][cid])
    return b"".join(parts)


def parse_request(data: bytes, verifier_bytes: int = 0) -> tuple[int, Binding | None, list[tuple[int, bytes, bytes]]]:
    """(round, binding, items) of a request, refused whole unless its ids strictly increase and no byte is left
    over. With ``verifier_bytes`` (the norm check's), :func:`parse_checked_request` gives t and the shares too."""
    round_idx, binding, items, _check = parse_checked_request(data, verifier_bytes)
    return round_idx, binding, items


def parse_checked_request(
    data: bytes, verifier_bytes: int
) -> tuple[int, Binding | None, list[tuple[int, bytes, bytes]], tuple[int, dict[int, bytes]] | None]:
    """:func:`parse_request`, and (t, each client's verifier share) where ``verifier_bytes`` is not zero."""
    if len(data) < _REQUEST.size:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF request shorter than its header")
    magic, round_idx, count = _REQUEST.unpack_from(data)
    binding, at = None, _REQUEST.size
    if magic == b"DPFB":
        binding, at = Binding.from_bytes(bytes(data[at : at + BINDING_BYTES])), at + BINDING_BYTES
    elif magic != b"DPFQ":
        raise RejectedPayload(Reason.GARBAGE, "not a DPF request")
    check = None
    if verifier_bytes:
        if len(data) < at + 8:
            raise RejectedPayload(Reason.TRUNCATED, "a DPF request without its query point")
        check, at = (int.from_bytes(data[at : at + 8], "little"), {}), at + 8
    items: list[tuple[int, bytes, bytes]] = []
    for _ in range(count):
        if len(data) < at + _ITEM.size:
            raise RejectedPayload(Reason.TRUNCATED, "a DPF request cut short")
        cid, n = _ITEM.unpack_from(data, at)
        at += _ITEM.size
        if len(data) < at + n + DIGEST_BYTES + verifier_bytes:
            raise RejectedPayload(Reason.TRUNCATED, "a DPF request cut short")
        if items and cid <= items[-1][0]:
            raise RejectedPayload(Reason.GARBAGE, "a DPF request's clients out of order or listed twice")
        items.append((cid, bytes(data[at : at + n]), bytes(data[at + n : at + n + DIGEST_BYTES])))
        at += n + DIGEST_BYTES
        if check is not None:
            check[1][cid], at = bytes(data[at : at + verifier_bytes]), at + verifier_bytes
    if at != len(data):
        raise RejectedPayload(Reason.WRONG_SHAPE, "bytes after a DPF request's last client")
    return round_idx, binding, items, check


def pack_answer(round_idx: int, answers: dict[int, bytes | str]) -> bytes:
    """The key holder's answer: each client's digest, or the reason it refused the client's upload."""
    parts = [_ANSWER.pack(b"DPFA", round_idx, len(answers))]
    for cid, value in sorted(answers.items()):
        if isinstance(value, str):
            reason = value.encode()
            parts.append(_ANSWER_ITEM.pack(cid, 1) + struct.pack(">H", len(reason)) + reason)
        else:
            parts.append(_ANSWER_ITEM.pack(cid, 0) + value)
    return b"".join(parts)


def parse_answer(data: bytes, round_idx: int) -> dict[int, bytes | str]:
    """client -> the key holder's digest of its keys, or the reason it refused them; a malformed answer, or one
    of another round, is refused whole."""
    if len(data) < _ANSWER.size:
        raise RejectedPayload(Reason.TRUNCATED, "a DPF answer shorter than its header")
    magic, answered, count = _ANSWER.unpack_from(data)
    if magic != b"DPFA":
        raise RejectedPayload(Reason.GARBAGE, "not a DPF answer")
    if answered != round_idx:
        raise RejectedPayload(Reason.WRONG_ROUND, f"a DPF answer of round {answered}, expected {round_idx}")
    out: dict[int, bytes | str] = {}
    at = _ANSWER.size
    try:
        for _ in range(count):
            cid, status = _ANSWER_ITEM.unpack_from(data, at)
            at += _ANSWER_ITEM.size
            if out and cid <= max(out):
                raise RejectedPayload(Reason.GARBAGE, "a DPF answer's clients out of order or listed twice")
            if status == 0 and len(data) >= at + DIGEST_BYTES:
                out[cid], at = bytes(data[at : at + DIGEST_BYTES]), at + DIGEST_BYTES
            elif status == 1:
                (n,) = struct.unpack_from(">H", data, at)
                out[cid], at = bytes(data[at + 2 : at + 2 + n]).decode("ascii"), at + 2 + n
            else:
                raise RejectedPayload(Reason.GARBAGE, "a DPF answer's entry is neither a digest nor a refusal")
    except (struct.error, UnicodeDecodeError):
        raise RejectedPayload(Reason.GARBAGE, "a DPF answer cut short or not ASCII") from None
    if at != len(data):
        raise RejectedPayload(Reason.WRONG_SHAPE, "bytes after a DPF answer's last client")
    return out
