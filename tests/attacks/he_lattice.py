"""Tools for the key-recovery attack tests: raw SEAL ciphertext coefficients and negacyclic NTTs.

Nothing here uses a secret key: this is what an aggregator holding public
ciphertexts and a released decryption can compute.
"""

from __future__ import annotations

import os
import tempfile
import zlib

import numpy as np


def _unzstd(b: bytes) -> bytes:
    """A zstd frame of raw/RLE blocks (SEAL's compression of random ciphertext data); zstandard otherwise."""
    if b[:4] != b"\x28\xb5\x2f\xfd":
        raise ValueError("not a zstd frame")
    fhd, pos = b[4], 5
    single = (fhd >> 5) & 1
    pos += 0 if single else 1
    pos += [0, 1, 2, 4][fhd & 3]
    pos += [1 if single else 0, 2, 4, 8][fhd >> 6]
    out = bytearray()
    while True:
        h = int.from_bytes(b[pos : pos + 3], "little")
        pos += 3
        kind, size = (h >> 1) & 3, h >> 3
        if kind == 0:
            out += b[pos : pos + size]
            pos += size
        elif kind == 1:
            out += b[pos : pos + 1] * size
            pos += 1
        else:
            import zstandard  # only if SEAL really compressed something

            return zstandard.ZstdDecompressor().decompress(b)
        if h & 1:
            return bytes(out)


def seal_polys(obj, n_polys: int, n: int, primes: int) -> np.ndarray:
    """(n_polys, primes, n) uint64 RNS coefficients of a SEAL Ciphertext or Plaintext, read from its serialization."""
    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        obj.save(path)
        with open(path, "rb") as f:
            data = f.read()
    finally:
        os.unlink(path)
    mode, size = data[5], int.from_bytes(data[8:16], "little")
    body = {0: lambda x: x, 1: zlib.decompress, 2: _unzstd}[mode](data[16:size])
    k = n_polys * primes * n * 8
    return np.frombuffer(body[-k:], dtype=np.uint64).reshape(n_polys, primes, n)


class Negacyclic:
    """NTT over Z_q[x]/(x^N + 1): evaluations at psi^(2i+1), i = 0..N-1 (so i and N-1-i are conjugate)."""

    def __init__(self, n: int, q: int):
        self.n, self.q = n, q
        g = 2
        while True:
            psi = pow(g, (q - 1) // (2 * n), q)
            if pow(psi, n, q) == q - 1:
                break
            g += 1
        self.psi = psi
        self.w = psi * psi % q
        self.pw = np.array([pow(psi, k, q) for k in range(n)], dtype=object)
        self.ipw = np.array([pow(psi, -k, q) for k in range(n)], dtype=object)
        bits = n.bit_length() - 1
        self.rev = np.array([int(format(i, f"0{bits}b")[::-1], 2) for i in range(n)])

    def _cyclic(self, a: np.ndarray, w: int) -> np.ndarray:
        q, n = self.q, self.n
        a = a[self.rev]
        m = 1
        while m < n:
            wm = pow(w, n // (2 * m), q)
            tw = np.array([pow(wm, j, q) for j in range(m)], dtype=object)
            blocks = a.reshape(-1, 2 * m)
            u, v = blocks[:, :m], (blocks[:, m:] * tw) % q
            a = np.concatenate([(u + v) % q, (u - v) % q], axis=1).reshape(-1)
            m *= 2
        return a

    def forward(self, coeffs) -> np.ndarray:
        a = np.array([int(c) % self.q for c in coeffs], dtype=object)
        return self._cyclic((a * self.pw) % self.q, self.w)

    def inverse(self, values) -> np.ndarray:
        a = self._cyclic(np.array(values, dtype=object), pow(self.w, -1, self.q))
        return (a * pow(self.n, -1, self.q) % self.q) * self.ipw % self.q

    def inv(self, values) -> np.ndarray:
        return np.array([pow(int(v), -1, self.q) for v in values], dtype=object)


def crt(residues: list[np.ndarray], primes: list[int]) -> list[int]:
    """Combine per-prime residues (object arrays) into integers mod the product."""
    q = 1
    for p in primes:
        q *= p
    out = [0] * len(residues[0])
    for r, p in zip(residues, primes):
        m = q // p
        coef = m * pow(m, -1, p)
        out = [(o + int(x) * coef) % q for o, x in zip(out, r)]
    return out


def centred(values, q: int) -> list[int]:
    return [v - q if v > q // 2 else v for v in (int(x) % q for x in values)]
