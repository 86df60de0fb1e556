r"""Where DP's randomness comes from: which clients a round samples, and every noise draw.

Each draw has a name, ``(purpose, round, party)``, and its own AES-256-CTR
keystream under the key HKDF-SHA256(secret, name). Draws are therefore
independent of each other, reproducible from the secret alone (a resumed run
continues exactly, with nothing else saved), and each party of a deployment
can hold its own secret and draw its own noise share.

The secret (``privacy.dp.noise``):

* ``"secure"`` (default): 32 bytes from the operating system's CSPRNG when the
  run starts, kept only in the run's checkpoint, which is written 0600. Anyone
  holding the policy, the code and every released model still cannot predict
  the sample or the noise.
* ``"seeded"``: derived from the policy's ``seed``. Reproducible, for studies,
  and predictable by anyone who has the policy file: they can recompute the
  sample and subtract the noise, so such a run gives **no** privacy guarantee
  against them. Runs in this mode say so in every output.

Gaussian draws are the inverse normal CDF (``torch.special.ndtri``) of 53-bit
uniforms :math:`(k + \tfrac12)\,2^{-53}`, :math:`k` uniform in :math:`[0, 2^{53})`,
so they reach :math:`\pm 8.3\sigma`. Floating-point attacks on samplers
(Mironov, CCS 2012) read the low-order bits of a released noisy value; every
value DP releases here is first rounded to the fixed-point grid
(:mod:`fedrecgel_secure.privacy.secagg.fixedpoint`, :math:`2^{-36}` by default),
far coarser than the sampler's resolution and far finer than the noise.
"""

from __future__ import annotations

import hashlib
import secrets
import struct

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import NoiseSource

SECRET_BYTES = 32
_INFO = b"fedrecgel/dp-randomness/v1/"
_ZERO_NONCE = bytes(16)  # every key draws one stream only, so a fixed nonce is never reused under a key
_MANTISSA = (1 << 53) - 1


class DPRandomness:
    """Named draws from a keyed CSPRNG (see the module docstring)."""

    def __init__(self, secret: bytes, source: NoiseSource) -> None:
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise BadInputError(f"the DP randomness secret must be {SECRET_BYTES} bytes")
        if source not in ("secure", "seeded"):
            raise BadInputError(f"privacy.dp.noise must be 'secure' or 'seeded', got {source!r}")
        self._secret = secret
        self.source: NoiseSource = source

    @classmethod
    def fresh(cls) -> DPRandomness:
        """A new run's secret, from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(SECRET_BYTES), "secure")

    @classmethod
    def from_seed(cls, seed: int) -> DPRandomness:
        """Research mode: the secret is a public function of the policy's seed."""
        return cls(hashlib.sha256(_INFO + b"seeded/" + str(int(seed)).encode()).digest(), "seeded")

    def _keystream(self, purpose: str, round_idx: int, party: int, n: int) -> np.ndarray:
        info = _INFO + purpose.encode() + struct.pack(">qq", round_idx, party)
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(self._secret)
        out = np.empty(n, dtype=np.uint64)
        Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE)).encryptor().update_into(bytes(8 * n), out.view(np.uint8))
        return out

    def uniform(self, purpose: str, round_idx: int, party: int, n: int) -> torch.Tensor:
        """``n`` independent uniforms in (0, 1), float64, 53 random bits each."""
        words = torch.from_numpy(self._keystream(purpose, round_idx, party, n).view(np.int64))
        # >> on int64 is arithmetic; the mask keeps the top 53 bits as an unsigned value.
        top = torch.bitwise_and(torch.bitwise_right_shift(words, 11), _MANTISSA)
        return (top.to(torch.float64) + 0.5) * 2.0**-53

    def normal(self, purpose: str, round_idx: int, party: int, n: int, std: float) -> torch.Tensor:
        """``n`` independent N(0, std²) draws, float64."""
        if not (np.isfinite(std) and std >= 0):
            raise ValueError(f"noise std must be finite and >= 0, got {std!r}")
        return torch.special.ndtri(self.uniform(purpose, round_idx, party, n)).mul_(std)

    def state_dict(self) -> dict[str, str]:
        """What a checkpoint keeps: the secret (which is why checkpoints are 0600) and the source."""
        return {"secret": self._secret.hex(), "source": self.source}

    @classmethod
    def from_state_dict(cls, state: dict[str, str]) -> DPRandomness:
        return cls(bytes.fromhex(state["secret"]), state["source"])
