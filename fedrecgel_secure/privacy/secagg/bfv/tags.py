"""Aggregate tags: the key holder checks that a decrypted aggregate is the sum of exactly the uploads its proofs name.

The key holder cannot see the individual ciphertexts (it would then read every
upload), so signatures over ciphertext digests alone do not tie the aggregate
it is handed to the proofs that come with it. Each ciphertext therefore carries,
in its last slot, a linearly homomorphic tag of its N − 1 data slots::

    tag_i = <α, g_i> + k_i   (mod t)

α is a secret vector known to the clients and the key holder, k_i a per-client,
per-round, per-ciphertext pad known only to client i and the key holder. After
decrypting, the key holder checks, per ciphertext, that the tag slot equals
<α, data> + Σ k_i over the clients its proofs name, and releases nothing if it
does not. An aggregator that does not know the pads cannot make the check pass
unless every named client's tag enters with weight 1, and (whether or not it
learned α from a colluding client) unless the data slots then are the sum of
those clients' uploads plus values it knows: one client's ciphertext with the
proofs of others, a sum missing a named client, or uploads masked slot by slot
are all refused, except with probability about 1/t per check. The tag slot is
never released.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import struct

import numpy as np

KEY_BYTES = 32
CLIENT_KEY_BYTES = 2 * KEY_BYTES  # α key | pad key


class TagKeys:
    """The key holder's tag secrets: one master key from which every client's keys derive."""

    def __init__(self, master: bytes | None = None) -> None:
        self.master = secrets.token_bytes(KEY_BYTES) if master is None else bytes(master)
        if len(self.master) != KEY_BYTES:
            raise ValueError("tag master key must be 32 bytes")

    def _derive(self, label: bytes) -> bytes:
        return hmac.new(self.master, b"fedrecgel-he-tags/v1/" + label, hashlib.sha256).digest()

    def alpha_key(self) -> bytes:
        return self._derive(b"alpha")

    def pad_key(self, client_id: int) -> bytes:
        return self._derive(b"pad" + struct.pack(">I", client_id))

    def client_key(self, client_id: int) -> bytes:
        """What client ``client_id`` gets at registration, over a confidential channel: α key | its pad key."""
        return self.alpha_key() + self.pad_key(client_id)


_LIMB = 20  # α and values split into 20-bit limbs: each limb product has 40 bits, a row sum of 8191 of them < 2^53


@functools.lru_cache(maxsize=4)
def alpha(alpha_key: bytes, n_chunks: int, width: int, t: int) -> np.ndarray:
    """α coefficients in [0, t) as (3, n_chunks, width) int64 20-bit limbs; read-only.

    Cached: every client of a deployment has the same α, and a simulated session
    holds thousands of clients, so they share one array.
    """
    raw = hashlib.shake_256(b"fedrecgel-he-alpha/v1" + alpha_key).digest(8 * n_chunks * width)
    words = (np.frombuffer(raw, dtype=np.uint64) % np.uint64(t)).reshape(n_chunks, width)
    out = _limbs(words)
    out.flags.writeable = False
    return out


def _limbs(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.uint64)
    mask = np.uint64((1 << _LIMB) - 1)
    return np.stack([((v >> np.uint64(_LIMB * k)) & mask).astype(np.int64) for k in range(3)])


def inner(alpha_limbs: np.ndarray, rows: np.ndarray, t: int) -> list[int]:
    """<α_c, rows_c> mod t for every row c, exactly; ``rows`` are integers (any sign), one row per ciphertext."""
    if rows.shape[1] >= 2 ** (63 - 2 * _LIMB):
        raise ValueError("rows too wide for exact limb sums")
    v = _limbs(np.asarray(rows, dtype=np.int64) % t)
    sums = [[(alpha_limbs[i] * v[j]).sum(axis=1) for j in range(3)] for i in range(3)]
    return [
        sum(int(sums[i][j][c]) << (_LIMB * (i + j)) for i in range(3) for j in range(3)) % t
        for c in range(rows.shape[0])
    ]


def pad(pad_key: bytes, session_tag: bytes, round_idx: int, chunk: int, t: int) -> int:
    msg = struct.pack(">H", len(session_tag)) + session_tag + struct.pack(">QI", round_idx, chunk)
    return int.from_bytes(hmac.new(pad_key, msg, hashlib.sha512).digest(), "big") % t
