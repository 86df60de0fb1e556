"""AES-128 encryption (FIPS-197) of many blocks at once in torch tensor operations, for a GPU: torch has no AES.

The DPF servers' hash (:mod:`.prg`) is fixed-key AES; on the CPU it runs in ``cryptography`` (AES-NI), which is
this module's oracle (``tests/secagg/test_dpf_torch.py``: FIPS-197's known answer and agreement on random blocks
under every key of the hash). A state is a (n, 16) uint8 tensor in FIPS-197's byte order (column after column);
a round is one S-box lookup on the shifted rows, MixColumns as XORs and doublings in GF(2^8) on the (n, 4, 4)
view, and the round key's XOR, each over the whole batch.

Not constant-time: the S-box lookup is indexed by state bytes, which derive from the server's own key shares.
It runs on the server's own GPU, inside the threat model's trusted server; a process that can time that GPU's
memory accesses is outside it.
"""

from __future__ import annotations

import numpy as np
import torch

ROUNDS = 10


def _xtime(a: int) -> int:
    """``a`` times x in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1."""
    return ((a << 1) ^ (0x1B if a & 0x80 else 0)) & 0xFF


def _sbox() -> list[int]:
    """FIPS-197's S-box (section 5.1.1): the inverse in GF(2^8), then the affine map; derived, not typed in."""
    exp, log = [0] * 255, [0] * 256
    x = 1
    for i in range(255):  # 3 generates the multiplicative group
        exp[i], log[x] = x, i
        x ^= _xtime(x)
    box = []
    for a in range(256):
        inv = 0 if a == 0 else exp[(255 - log[a]) % 255]
        s = inv
        for k in range(1, 5):
            s ^= ((inv << k) | (inv >> (8 - k))) & 0xFF
        box.append(s ^ 0x63)
    return box


SBOX = _sbox()
# ShiftRows: byte 4c + r of the output is byte 4((c + r) mod 4) + r of the input
SHIFT_ROWS = [4 * ((i // 4 + i % 4) % 4) + i % 4 for i in range(16)]


def round_keys(key: bytes) -> np.ndarray:
    """AES-128's key schedule (FIPS-197 section 5.2): the 11 round keys of a 16-byte key, (11, 16) uint8."""
    if len(key) != 16:
        raise ValueError(f"an AES-128 key has 16 bytes, not {len(key)}")
    words = [list(key[4 * i : 4 * i + 4]) for i in range(4)]
    rcon = 1
    for i in range(4, 4 * (ROUNDS + 1)):
        temp = list(words[i - 1])
        if i % 4 == 0:
            temp = [SBOX[b] for b in temp[1:] + temp[:1]]
            temp[0] ^= rcon
            rcon = _xtime(rcon)
        words.append([a ^ b for a, b in zip(words[i - 4], temp)])
    return np.array(words, dtype=np.uint8).reshape(ROUNDS + 1, 16)


class AES128:
    """One fixed key's encryption of batches of blocks on one torch device."""

    def __init__(self, key: bytes, device: torch.device | str = "cpu") -> None:
        self.keys = torch.from_numpy(round_keys(key)).to(device)
        self.sbox = torch.tensor(SBOX, dtype=torch.uint8, device=device)
        self.shift = torch.tensor(SHIFT_ROWS, dtype=torch.int64, device=device)

    def encrypt(self, blocks: torch.Tensor) -> torch.Tensor:
        """Each 16-byte row of ``blocks`` ((n, 16) uint8, on this key's device) encrypted: ECB, by design."""
        s = blocks ^ self.keys[0]
        for r in range(1, ROUNDS + 1):
            s = self.sbox[s[:, self.shift].int()]  # SubBytes after ShiftRows: the S-box is bytewise, so they commute
            if r < ROUNDS:
                s = _mix_columns(s)
            s ^= self.keys[r]
        return s


def _mix_columns(s: torch.Tensor) -> torch.Tensor:
    """MixColumns: each column (a0..a3) to ``a_i ⊕ t ⊕ 2·(a_i ⊕ a_{i+1})`` with ``t = a0 ⊕ a1 ⊕ a2 ⊕ a3``, which is
    FIPS-197's ``2a_i ⊕ 3a_{i+1} ⊕ a_{i+2} ⊕ a_{i+3}`` rearranged."""
    cols = s.view(-1, 4, 4)
    t = cols[:, :, 0] ^ cols[:, :, 1] ^ cols[:, :, 2] ^ cols[:, :, 3]
    u = cols ^ cols.roll(-1, dims=2)
    doubled = (u << 1) ^ ((u >> 7) * 0x1B)  # uint8: the shift drops the top bit, the reduction puts it back
    return (cols ^ t[:, :, None] ^ doubled).view(-1, 16)
