"""Wire formats of the masking protocol (this package): bodies of the signed envelopes.

Every function here checks layout only; signatures are checked by the roles.
Decoders raise :class:`RejectedPayload` and nothing else on malformed input.

Aggregator → client bodies (signed by the server, :class:`~fedrecgel_secure.privacy.secagg.identity.ServerIdentity`):

* ``MASK_ANNOUNCE``: ``"MKR1" | round u64 | seed[16]``
* ``MASK_COHORT``: ``"MKB1" | round u64 | count u32 | seed[16] | (len u32 | advert envelope)*``
* ``MASK_INBOX``: ``recipient u32 | "MKI1" | round u64 | count u32 | (sender u32 | ciphertext[84])*``
* ``MASK_CHECK``: ``"MKU1" | round u64 | count u32 | (id u32)*`` (ascending survivor ids)
* ``MASK_REQUEST``: the ``MASK_CHECK`` body, then ``"MKC1" | round u64 | count u32 | (id u32 | signature[64])*``

Client → aggregator bodies (signed by the client):

* ``MASK_ADVERTISE``: ``c_pub[32] | s_pub[32]``
* ``MASK_SHARES``: ``count u32 | (receiver u32 | ciphertext[84])*``
* ``MASK_INPUT``: ``dim`` little-endian u64
* ``MASK_CONFIRM``: ``cohort digest[32] | MASK_CHECK body``
* ``MASK_UNMASK``: ``count u32 | (owner u32 | kind u8 | share[32])*``

A host's group (a deployment's node, in place of its users' ``MASK_INPUT`` envelopes; not an envelope itself):

* ``"MKG1" | round u64 | count u32 | (id u32)* | dim little-endian u64 | (signature[64])*``: the listed users'
  masked inputs summed mod 2^64, then one signature per listed user, in list order, each over
  (``Kind.MASK_GROUP``, round, its id, SHA-256 of everything before the signatures) under the attempt's context.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np

from fedrecgel_secure.errors import BadInputError

from .. import shamir
from ..errors import Reason, RejectedPayload
from ..identity import SIGNATURE_BYTES, Envelope
from .masks import _U32, SEED_BYTES, x25519_public

_ANNOUNCE = struct.Struct(">4sQ16s")
_LIST_HEAD = struct.Struct(">4sQI")
_SHARE_PLAIN = 2 * shamir.SHARE_BYTES
_SHARE_CT = _SHARE_PLAIN + 16  # Poly1305 tag
_SHARE_ENTRY = 4 + _SHARE_CT
_UNMASK_ENTRY = 4 + 1 + shamir.SHARE_BYTES
_CONFIRM_ENTRY = 4 + SIGNATURE_BYTES
_SELF, _PAIR = 0, 1


def encode_announcement(round_idx: int, round_seed: bytes) -> bytes:
    return _ANNOUNCE.pack(b"MKR1", round_idx, round_seed)


def decode_announcement(data: bytes) -> tuple[int, bytes]:
    data = bytes(data)
    if len(data) != _ANNOUNCE.size:
        raise RejectedPayload(
            Reason.TRUNCATED if len(data) < _ANNOUNCE.size else Reason.GARBAGE, "bad announcement length"
        )
    magic, round_idx, seed = _ANNOUNCE.unpack(data)
    if magic != b"MKR1":
        raise RejectedPayload(Reason.GARBAGE, "not a round announcement")
    return round_idx, seed


def _decode_list(data: bytes, magic: bytes, round_idx: int, what: str, off: int = 0) -> tuple[int, int]:
    if len(data) - off < _LIST_HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, f"{what} shorter than its header")
    got_magic, got_round, count = _LIST_HEAD.unpack_from(data, off)
    if got_magic != magic:
        raise RejectedPayload(Reason.GARBAGE, f"not a {what}")
    if got_round != round_idx:
        raise RejectedPayload(Reason.WRONG_ROUND, f"{what} for round {got_round}, expected {round_idx}")
    return count, off + _LIST_HEAD.size


def encode_adverts(round_idx: int, round_seed: bytes, adverts: Sequence[bytes]) -> bytes:
    return (
        _LIST_HEAD.pack(b"MKB1", round_idx, len(adverts))
        + round_seed
        + b"".join(_U32.pack(len(a)) + a for a in adverts)
    )


def decode_adverts(data: bytes, round_idx: int, round_seed: bytes) -> list[Envelope]:
    data = bytes(data)
    count, off = _decode_list(data, b"MKB1", round_idx, "advert broadcast")
    if data[off : off + SEED_BYTES] != round_seed:
        raise RejectedPayload(Reason.WRONG_ROUND, "advert broadcast is for another attempt of the round")
    off += SEED_BYTES
    envelopes = []
    for _ in range(count):
        if off + 4 > len(data):
            raise RejectedPayload(Reason.TRUNCATED, "advert broadcast ends early")
        (length,) = _U32.unpack_from(data, off)
        off += 4
        if off + length > len(data):
            raise RejectedPayload(Reason.TRUNCATED, "advert broadcast ends inside an advert")
        envelopes.append(Envelope.parse(data[off : off + length]))
        off += length
    if off != len(data):
        raise RejectedPayload(Reason.GARBAGE, "trailing bytes after the adverts")
    ids = [e.client_id for e in envelopes]
    if len(set(ids)) != len(ids):
        raise RejectedPayload(Reason.GARBAGE, "advert broadcast lists a client twice")
    return envelopes


def _encode_fixed(magic: bytes, round_idx: int, entries: Sequence[bytes]) -> bytes:
    return _LIST_HEAD.pack(magic, round_idx, len(entries)) + b"".join(entries)


def _decode_fixed(data: bytes, magic: bytes, round_idx: int, size: int, what: str, off: int = 0) -> list[bytes]:
    data = bytes(data)
    count, off = _decode_list(data, magic, round_idx, what, off)
    if len(data) - off != count * size:
        reason = Reason.TRUNCATED if len(data) - off < count * size else Reason.GARBAGE
        raise RejectedPayload(reason, f"{what} of {len(data)} bytes does not hold {count} entries")
    return [data[off + k * size : off + (k + 1) * size] for k in range(count)]


def encode_inbox(round_idx: int, recipient: int, entries: Sequence[tuple[int, bytes]]) -> bytes:
    return _U32.pack(recipient) + _encode_fixed(b"MKI1", round_idx, [_U32.pack(s) + ct for s, ct in entries])


def decode_inbox(data: bytes, round_idx: int) -> tuple[int, dict[int, bytes]]:
    """Encrypted shares routed to one client: (recipient, sender -> ciphertext)."""
    data = bytes(data)
    if len(data) < 4:
        raise RejectedPayload(Reason.TRUNCATED, "share inbox shorter than its recipient")
    (recipient,) = _U32.unpack_from(data)
    out: dict[int, bytes] = {}
    for entry in _decode_fixed(data[4:], b"MKI1", round_idx, _SHARE_ENTRY, "share inbox"):
        (sender,) = _U32.unpack_from(entry)
        if sender in out:
            raise RejectedPayload(Reason.GARBAGE, f"share inbox lists sender {sender} twice")
        out[sender] = entry[4:]
    return recipient, out


def encode_survivors(round_idx: int, survivors: Sequence[int]) -> bytes:
    return _encode_fixed(b"MKU1", round_idx, [_U32.pack(c) for c in survivors])


def decode_survivors(data: bytes, round_idx: int) -> list[int]:
    ids = [_U32.unpack(e)[0] for e in _decode_fixed(data, b"MKU1", round_idx, 4, "survivor list")]
    if ids != sorted(set(ids)):
        raise RejectedPayload(Reason.GARBAGE, "survivor list must hold distinct ids in ascending order")
    return ids


def confirmation_body(digest: bytes, round_idx: int, survivors: Sequence[int]) -> bytes:
    """What a client signs in the consistency check: the cohort it saw and the survivor set."""
    return bytes(digest) + encode_survivors(round_idx, survivors)


def encode_request(round_idx: int, survivors: Sequence[int], confirmations: Mapping[int, bytes]) -> bytes:
    entries = [_U32.pack(c) + confirmations[c] for c in sorted(confirmations)]
    return encode_survivors(round_idx, survivors) + _encode_fixed(b"MKC1", round_idx, entries)


def decode_request(data: bytes, round_idx: int) -> tuple[list[int], dict[int, bytes]]:
    """An unmask request: (survivors, client id -> its signature on the confirmation body)."""
    data = bytes(data)
    count, _ = _decode_list(data, b"MKU1", round_idx, "unmask request")
    split = _LIST_HEAD.size + 4 * count
    if len(data) < split:
        raise RejectedPayload(Reason.TRUNCATED, "unmask request ends inside its survivor list")
    survivors = decode_survivors(data[:split], round_idx)
    sigs: dict[int, bytes] = {}
    for entry in _decode_fixed(data, b"MKC1", round_idx, _CONFIRM_ENTRY, "confirmation list", split):
        (signer,) = _U32.unpack_from(entry)
        if signer in sigs:
            raise RejectedPayload(Reason.GARBAGE, f"confirmation list names client {signer} twice")
        sigs[signer] = entry[4:]
    return survivors, sigs


def decode_share_bundle(body: bytes, client_id: int | None = None) -> dict[int, bytes]:
    """A SHARES body: receiver -> ciphertext of (b-share, s-share)."""
    if len(body) < 4:
        raise RejectedPayload(Reason.TRUNCATED, "share bundle shorter than its count", client_id)
    (count,) = _U32.unpack_from(body)
    if len(body) - 4 != count * _SHARE_ENTRY:
        raise RejectedPayload(
            Reason.WRONG_SHAPE, f"share bundle of {len(body)} bytes does not hold {count} shares", client_id
        )
    out: dict[int, bytes] = {}
    for k in range(count):
        entry = body[4 + k * _SHARE_ENTRY : 4 + (k + 1) * _SHARE_ENTRY]
        (receiver,) = _U32.unpack_from(entry)
        if receiver in out:
            raise RejectedPayload(Reason.BAD_SHARE, f"two shares for receiver {receiver}", client_id)
        out[receiver] = entry[4:]
    return out


def encode_unmask(entries: Sequence[tuple[int, int, int]]) -> bytes:
    return _U32.pack(len(entries)) + b"".join(
        struct.pack(">IB", o, k) + shamir.share_to_bytes(y) for o, k, y in entries
    )


def decode_unmask(body: bytes, client_id: int | None = None) -> dict[int, tuple[int, int]]:
    """An UNMASK body: owner -> (kind, share value)."""
    if len(body) < 4:
        raise RejectedPayload(Reason.TRUNCATED, "unmask response shorter than its count", client_id)
    (count,) = _U32.unpack_from(body)
    if len(body) - 4 != count * _UNMASK_ENTRY:
        raise RejectedPayload(
            Reason.WRONG_SHAPE, f"unmask response of {len(body)} bytes does not hold {count} shares", client_id
        )
    out: dict[int, tuple[int, int]] = {}
    for k in range(count):
        entry = body[4 + k * _UNMASK_ENTRY : 4 + (k + 1) * _UNMASK_ENTRY]
        owner, kind = struct.unpack_from(">IB", entry)
        if owner in out or kind not in (_SELF, _PAIR):
            raise RejectedPayload(Reason.BAD_SHARE, f"bad or repeated share entry for client {owner}", client_id)
        try:
            out[owner] = (kind, shamir.share_from_bytes(entry[5:]))
        except BadInputError as exc:
            raise RejectedPayload(Reason.BAD_SHARE, str(exc), client_id) from None
    return out


def decode_masked(body: bytes, dim: int, client_id: int | None = None) -> np.ndarray:
    if len(body) != 8 * dim:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"masked input of {len(body)} bytes, expected {8 * dim}", client_id)
    return np.frombuffer(body, dtype="<u8")


def decode_keys(body: bytes, client_id: int, *, probe: bool = True) -> tuple[bytes, bytes]:
    """An ADVERTISE body: (c_pub, s_pub); with ``probe``, each checked to be a usable X25519 key (``bad_key``).

    Clients pass ``probe=False``: they run the real exchanges at once and treat
    the error they raise on such a key the same way.
    """
    if len(body) != 64:
        raise RejectedPayload(Reason.WRONG_SHAPE, f"key advert of {len(body)} bytes, expected 64", client_id)
    c_pub, s_pub = bytes(body[:32]), bytes(body[32:])
    if probe:
        x25519_public(c_pub, client_id)
        x25519_public(s_pub, client_id)
    return c_pub, s_pub


def group_statement(round_idx: int, users: Sequence[int], total: np.ndarray) -> bytes:
    """What every user of a group signs: the round, the ascending list of its users and their masked inputs' sum."""
    return (
        _LIST_HEAD.pack(b"MKG1", round_idx, len(users))
        + b"".join(_U32.pack(u) for u in users)
        + np.asarray(total, dtype=np.uint64).astype("<u8", copy=False).tobytes()
    )


def group_users(statement: bytes, round_idx: int) -> list[int]:
    """The users a group statement lists (ascending, distinct, at least one), checking its head only."""
    count, off = _decode_list(statement, b"MKG1", round_idx, "group")
    if count == 0 or len(statement) < off + 4 * count:
        raise RejectedPayload(Reason.TRUNCATED, "group lists no user, or ends inside its list")
    ids = [_U32.unpack_from(statement, off + 4 * k)[0] for k in range(count)]
    if ids != sorted(set(ids)):
        raise RejectedPayload(Reason.GARBAGE, "a group must list distinct users in ascending order")
    return ids


def encode_group(statement: bytes, signatures: Sequence[bytes]) -> bytes:
    return bytes(statement) + b"".join(signatures)


def decode_group(data: bytes, round_idx: int, dim: int) -> tuple[list[int], memoryview, np.ndarray, list[bytes]]:
    """A group: (its users, the statement they signed, the summed vector, their signatures in list order)."""
    data = bytes(data)
    users = group_users(data, round_idx)
    head = _LIST_HEAD.size + 4 * len(users)
    size = head + 8 * dim
    if len(data) != size + SIGNATURE_BYTES * len(users):
        reason = Reason.TRUNCATED if len(data) < size + SIGNATURE_BYTES * len(users) else Reason.WRONG_SHAPE
        raise RejectedPayload(reason, f"group of {len(data)} bytes does not hold {len(users)} users of dim {dim}")
    view = memoryview(data)
    signatures = [data[size + k * SIGNATURE_BYTES : size + (k + 1) * SIGNATURE_BYTES] for k in range(len(users))]
    return users, view[:size], np.frombuffer(data, dtype="<u8", count=dim, offset=head), signatures
