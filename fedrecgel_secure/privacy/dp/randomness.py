r"""Where DP's randomness comes from: which clients a round samples, and every noise draw.

Each draw has a name, ``(purpose, round, party, attempt)``, and its own
AES-256-CTR keystream under the key HKDF-SHA256(secret, name). Draws are
therefore independent of each other, reproducible from the secret alone (a
resumed run continues exactly, with nothing else saved), and each party of a
deployment can hold its own secret and draw its own noise share.

The attempt is in the name because noise must be bound to the release it
protects, not to the round alone: were a round run twice (a retry, a re-run
over other contributors) with the same draws, the difference of the two sums
would cancel the noise (``tests/attacks/test_dp_attempt_binding.py``). The
sample is not: a round samples its clients once, whatever its attempts, so a
retry cannot choose among samples. Attempt 0 keeps the name of the draws made
before attempts were named, so seeded runs of one attempt per round draw what
they drew before.

The secret (``privacy.dp.noise``):

* ``"secure"`` (default): 32 bytes from the operating system's CSPRNG when the
  run starts, kept only in the run's checkpoint, which is written 0600. Anyone
  holding the policy, the code and every released model still cannot predict
  the sample or the noise.
* ``"seeded"``: derived from the policy's ``seed``. Reproducible, for studies,
  and predictable by anyone who has the policy file: they can recompute the
  sample and subtract the noise, so such a run gives **no** privacy guarantee
  against them. Runs in this mode say so in every output.

Gaussian draws are :math:`\pm\,\sigma\,\Phi^{-1}(p)` (``torch.special.ndtri``) with a
random sign and a one-sided uniform :math:`p \in (0, \tfrac12)` that keeps full
floating-point precision down to :math:`2^{-117}`: the top bit of a 64-bit word
is the sign, the other 63 its fixed-point :math:`p`, and where those leave
fewer than 53 significant bits (:math:`p < 2^{-12}`) a second word adds 52
more. A plain 53-bit uniform in (0, 1) leaves consecutive outputs two or more
grid steps apart beyond about 4.8σ, and an observer who knows the other
clients' sum can then tell from an exact release whether the target took part
(``tests/attacks/test_dp_tail_support.py``). Here, up to :func:`gapless_bound`
(about 10σ at the shipped settings), consecutive outputs are less than one grid
step apart, so every grid point is reachable; what lies beyond is the
truncation, whose probability :func:`tail_delta` gives, the δ each release adds.

Floating-point attacks on samplers (Mironov, CCS 2012) read the low-order bits
of a released noisy value; every value DP releases here is first rounded to the
fixed-point grid (:mod:`fedrecgel_secure.privacy.secagg.fixedpoint`,
:math:`2^{-36}` by default), far coarser than the sampler's resolution and far
finer than the noise. Rounding to the grid is post-processing of the Gaussian,
and a sensitivity that moves the sum by whole grid steps commutes with it.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from collections.abc import Callable

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import NoiseSource

SECRET_BYTES = 32
# what each source of the secret guarantees, as a run's summary and its tracked parameters state it
GUARANTEE = {
    "secure": "(epsilon, delta)-DP per user against whoever sees the released aggregates",
    "seeded": "NONE against anyone who has the policy file: seeded noise is predictable from its seed (research mode)",
}
_INFO = b"fedrecgel/dp-randomness/v1/"
_ZERO_NONCE = bytes(16)  # every key draws one stream only, so a fixed nonce is never reused under a key
_MANTISSA = (1 << 53) - 1
_LOW63 = (1 << 63) - 1
_SIGN_BIT = -(1 << 63)  # the top bit of an int64
_REFINE_BELOW = 1 << 52  # a 63-bit fixed-point p with fewer significant bits than a double gets a second word
_TAIL_BITS = 52  # bits the second word adds: p = k 2^-64 + (j + 1/2) 2^-116, exact in a double
FINEST_P_STEP = 2.0**-116  # the smallest gap between two values of p the sampler can draw


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

    def _key(self, purpose: str, round_idx: int, party: int, stream: bytes, attempt: int) -> bytes:
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise ValueError(f"a draw's attempt must be an integer >= 0, got {attempt!r}")
        bound = b"" if attempt == 0 else b"/attempt" + struct.pack(">q", attempt)
        info = _INFO + purpose.encode() + struct.pack(">qq", round_idx, party) + bound + stream
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(self._secret)

    def _keystream(
        self, purpose: str, round_idx: int, party: int, n: int, stream: bytes = b"", attempt: int = 0
    ) -> np.ndarray:
        return self._keystreams(purpose, round_idx, [party], n, stream, attempt)[0]

    def _keystreams(
        self, purpose: str, round_idx: int, parties, n: int, stream: bytes = b"", attempt: int = 0
    ) -> np.ndarray:
        """(len(parties), n) uint64: row i is party i's stream of the draw, each under its own key."""
        zeros = bytes(8 * n)
        # into a bytearray (zero-filled up front), viewed by numpy afterwards: the cipher writing into a fresh numpy
        # array's untouched pages took five times as long (page faults). update_into wants a block's slack past
        # each row; the row after it overwrites that slack, the last row's is the buffer's own 15 bytes.
        out = bytearray(8 * n * len(parties) + 15)
        view = memoryview(out)
        for i, party in enumerate(parties):
            key = self._key(purpose, round_idx, int(party), stream, attempt)
            encryptor = Cipher(algorithms.AES(key), modes.CTR(_ZERO_NONCE)).encryptor()
            encryptor.update_into(zeros, view[8 * n * i : 8 * n * (i + 1) + 15])
        return np.frombuffer(out, dtype=np.uint64, count=n * len(parties)).reshape(len(parties), n)

    def uniform(self, purpose: str, round_idx: int, party: int, n: int) -> torch.Tensor:
        """``n`` independent uniforms in (0, 1), float64, 53 random bits each."""
        words = torch.from_numpy(self._keystream(purpose, round_idx, party, n).view(np.int64))
        # >> on int64 is arithmetic; the mask keeps the top 53 bits as an unsigned value.
        top = torch.bitwise_and(torch.bitwise_right_shift(words, 11), _MANTISSA)
        return (top.to(torch.float64) + 0.5) * 2.0**-53

    def normal(
        self, purpose: str, round_idx: int, party: int, n: int, std: float, *, attempt: int = 0, device=None
    ) -> torch.Tensor:
        """``n`` independent N(0, std²) draws, float64, with full-precision tails (see the module docstring).

        ``attempt``: which attempt of the round the draw protects; every attempt draws independent noise.
        ``device``: where the draws are made from the keystream's words (default: the host, where the words are);
        a GPU computes the Gaussians of a large model's noise in a fraction of the host's time."""
        _check_std(std)
        keystream = self._keystream(purpose, round_idx, party, n, attempt=attempt)
        words = torch.from_numpy(keystream.view(np.int64)).to(device)

        def tail_words(refine: torch.Tensor) -> torch.Tensor:  # the second words, from a stream of their own
            keystream = self._keystream(purpose, round_idx, party, refine.numel(), b"/tail", attempt)
            return torch.from_numpy(keystream.view(np.int64)).to(device)

        return gaussian_from_words(words, tail_words).mul_(std)

    def normal_rows(
        self, purpose: str, round_idx: int, parties: np.ndarray, n: int, std: float, *, attempt: int = 0
    ) -> torch.Tensor:
        """(len(parties), n) float64 on the host: row i is ``normal(purpose, round_idx, parties[i], n, std)``, bit
        for bit (each party's keys and streams), with the Gaussians of all rows made in one pass: the simulator
        draws a round's noise shares this way, a chunk of clients at a time, instead of one client at a time."""
        _check_std(std)
        rows = len(parties)
        words = torch.from_numpy(self._keystreams(purpose, round_idx, parties, n, attempt=attempt).view(np.int64))

        def tail_words(refine: torch.Tensor) -> torch.Tensor:
            # refine holds flat positions in row order, so each row's tail words follow the previous row's
            counts = torch.bincount(refine // max(n, 1), minlength=rows).tolist()
            streams = [
                self._keystream(purpose, round_idx, int(party), count, b"/tail", attempt)
                for party, count in zip(parties, counts, strict=True)
                if count
            ]
            joined = np.concatenate(streams) if streams else np.zeros(0, dtype=np.uint64)
            return torch.from_numpy(joined.view(np.int64))

        return gaussian_from_words(words.reshape(-1), tail_words).mul_(std).reshape(rows, n)

    def state_dict(self) -> dict[str, str]:
        """What a checkpoint keeps: the secret (which is why checkpoints are 0600) and the source."""
        return {"secret": self._secret.hex(), "source": self.source}

    @classmethod
    def from_state_dict(cls, state: dict[str, str]) -> DPRandomness:
        return cls(bytes.fromhex(state["secret"]), state["source"])


def _check_std(std: float) -> None:
    if not (np.isfinite(std) and std >= 0):
        raise ValueError(f"noise std must be finite and >= 0, got {std!r}")


def gaussian_from_words(words: torch.Tensor, tail_words: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    r"""Standard normal draws from uniform 64-bit ``words`` (int64), deterministic and monotone in the code.

    Word :math:`w`: sign = its top bit, :math:`k` = its low 63 bits, :math:`p = (k + \tfrac12)\,2^{-64}`.
    Where :math:`k < 2^{52}`, one more word (``tail_words(positions)`` gives them, one per position of such a
    word, in order) refines it to
    :math:`p = k\,2^{-64} + (j + \tfrac12)\,2^{-116}` with :math:`j` its top 52 bits, so :math:`p` is
    uniform on a grid of step :math:`2^{-116}` there and keeps a double's relative precision elsewhere.
    """
    return (_gaussian_on_host if words.device.type == "cpu" else _gaussian_torch)(words, tail_words)


def _gaussian_torch(words: torch.Tensor, tail_words: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """:func:`gaussian_from_words` in torch's operators, on any device."""
    k = torch.bitwise_and(words, _LOW63)
    refine = torch.nonzero(k < _REFINE_BELOW).squeeze(1)
    extra = _checked(tail_words(refine), refine)
    p = k.to(torch.float64).add_(0.5).mul_(2.0**-64)
    j = torch.bitwise_right_shift(extra, 64 - _TAIL_BITS).bitwise_and_((1 << _TAIL_BITS) - 1)
    p[refine] = k[refine].to(torch.float64).mul_(2.0**-64).add_(j.to(torch.float64).add_(0.5).mul_(2.0**-116))
    x = torch.special.ndtri(p)  # <= 0, so its sign bit is set; the word's top bit flips it
    x.view(torch.int64).bitwise_xor_(torch.bitwise_and(words, _SIGN_BIT))
    return x


def _gaussian_on_host(words: torch.Tensor, tail_words: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """:func:`gaussian_from_words` on the host, the same operations in numpy and in place: torch's int64 operators
    with a scalar and its fresh buffers took as long again as ndtri itself on a 2-core host; the torch code above
    is this one's oracle (``tests/federation/test_noised_sum.py``)."""
    w = words.numpy()
    k = np.bitwise_and(w, _LOW63)
    refine = np.flatnonzero(k < _REFINE_BELOW)
    extra = _checked(tail_words(torch.from_numpy(refine)), refine).numpy()
    p = np.add(k, 0.5)  # k widened to float64 (rounded to nearest, as torch's .to) plus 1/2
    p *= 2.0**-64
    j = np.bitwise_and(np.right_shift(extra, 64 - _TAIL_BITS), (1 << _TAIL_BITS) - 1)
    p[refine] = k[refine].astype(np.float64) * 2.0**-64 + (j.astype(np.float64) + 0.5) * 2.0**-116
    x = torch.from_numpy(p)
    torch.special.ndtri(x, out=x)
    np.bitwise_xor(p.view(np.int64), np.bitwise_and(w, _SIGN_BIT, out=k), out=p.view(np.int64))
    return x


def _checked(extra, refine):
    if extra.shape != refine.shape:
        raise ValueError(f"{len(extra)} tail words for {len(refine)} tail draws")
    return extra


def gapless_bound(std: float, grid_step: float) -> float:
    r"""How many stds out the sampler's outputs stay less than one grid step apart (0 if nowhere).

    Consecutive draws differ by :math:`\Delta x = \sigma\,\Delta p / \varphi(t)` at :math:`t = x/\sigma`.
    With :math:`\Delta p \le \max(2^{-116}, 2^{-52} p)` and :math:`p/\varphi(t) \le 1.26`, the body is
    gapless when :math:`1.26\,\sigma\,2^{-52} < g` and the tail while
    :math:`\varphi(t) > \sigma\, 2^{-116}/g`. Every grid point within the bound is reachable.
    """
    if not (std > 0 and grid_step > 0):
        raise ValueError(f"std and grid step must be > 0, got {std!r} and {grid_step!r}")
    if 1.26 * std * 2.0**-52 >= grid_step:
        return 0.0
    density = std * FINEST_P_STEP / grid_step  # the smallest phi(t) at which the tail is still gapless
    return math.sqrt(-2.0 * math.log(density * math.sqrt(2 * math.pi)))


def tail_delta(std: float, grid_step: float, coordinates: int) -> float:
    r"""The δ one release of ``coordinates`` noised values adds: the chance any draw leaves :func:`gapless_bound`.

    Beyond the bound a grid point may be unreachable, which a support test could read; the
    accountant adds this δ per release (:math:`2\,\bar\Phi(B)` per coordinate, union bound).
    """
    bound = gapless_bound(std, grid_step)
    return min(1.0, coordinates * math.erfc(bound / math.sqrt(2)))
