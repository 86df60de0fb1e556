"""The fixed-point grid that both secure-aggregation schemes sum on.

A real vector x becomes integers g = rint(x · 2^f), clipped to [-R·2^f, R·2^f]
(R = ``clip_range``, f = ``frac_bits``). Masking adds the integers in Z_{2^64},
homomorphic encryption in Z_t (BFV's plaintext modulus); as long as no sum
wraps around, both recover exactly Σ g_i and decode it to Σ g_i / 2^f, so the
two schemes release bit-identical aggregates. With n summands each coordinate
of the decoded sum is within n / 2^(f+1) of the sum of the clipped reals.

Noise is put on the same grid. A client's DP noise share ν is added as
rint(ν · 2^f) to its own integers, and central noise as rint(ν · 2^f) to the
sum: at the noise levels DP uses (millions of grid steps) a rounded Gaussian is
a discrete Gaussian up to a statistical distance far below float precision,
and the discrete Gaussian has the privacy of the continuous one for integer
sensitivity (Canonne, Kamath and Steinke, NeurIPS 2020). Because the released
value is an integer, nothing of the sampler's floating-point output survives
in it (the floating-point attacks of Mironov, CCS 2012, need those low bits).

Rounding can lengthen a vector: ‖rint(x·2^f)‖ ≤ ‖x‖·2^f + √D/2. A DP layer
that clips to norm C therefore clips to :meth:`FixedPoint.dp_clip` (C minus
√D / 2^(f+1)) so that the integers it hands over still have norm at most C·2^f.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedrecgel_secure.errors import BadInputError


@dataclass(frozen=True)
class FixedPoint:
    """Encoding of reals as integers: values in [-clip_range, clip_range] at 2^-frac_bits resolution."""

    clip_range: float = 32.0
    frac_bits: int = 36

    def __post_init__(self) -> None:
        r = self.clip_range
        if isinstance(r, bool) or not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise BadInputError(f"privacy.secure_aggregation.clip_range must be a finite number > 0, got {r!r}")
        f = self.frac_bits
        if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f <= 52:
            raise BadInputError(f"privacy.secure_aggregation.frac_bits must be an integer in [0, 52], got {f!r}")
        if self.limit >= 2**62:
            raise BadInputError(
                f"privacy.secure_aggregation.clip_range {r} at frac_bits {f} does not fit 62-bit integers;"
                " lower one of them"
            )

    @property
    def scale(self) -> float:
        return float(2**self.frac_bits)

    @property
    def limit(self) -> int:
        """Largest |integer| a client may hand over: R · 2^f."""
        return math.floor(self.clip_range * self.scale)

    def encode(self, x: np.ndarray, noise: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Integers (int64) of ``x`` plus its rounded ``noise`` share, clipped to ±R·2^f; and how many were clipped."""
        # One float64 buffer, worked in place (float32 input is widened exactly on the way), and the clipped
        # values counted only when the extremes say there are any: this runs over every simulated upload.
        g = np.multiply(np.asarray(x), self.scale, dtype=np.float64)
        np.rint(g, out=g)
        if noise is not None:
            g += self.encode_noise(noise)
        over = 0
        if g.size and (g.max() > self.limit or g.min() < -self.limit):
            over = int(np.count_nonzero(np.abs(g) > self.limit))
            np.clip(g, -self.limit, self.limit, out=g)
        return g.astype(np.int64), over

    def encode_tensor(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:  # noqa: F821 - imported inside
        """:meth:`encode` without noise for a tensor on any device: the same int64 values (float64 widening is exact,
        torch.round rounds half to even like np.rint) and the same clipped count, computed where ``x`` lives."""
        import torch  # here: the protocol modules that use this class need no torch

        g = torch.round(x.to(torch.float64) * self.scale)
        outside = g.abs() > self.limit
        over = int(outside.sum())
        if over:
            g.clamp_(-self.limit, self.limit)
        return g.to(torch.int64), over

    def clip_sum(self, g: np.ndarray) -> tuple[np.ndarray, int]:
        """The int64 sum over the rows of ``g`` (float64 grid values, one client a row, as :meth:`encode` has them
        before clipping), each value clipped as :meth:`encode` clips it; and how many were clipped."""
        over = 0
        if g.size and (g.max() > self.limit or g.min() < -self.limit):
            over = int(np.count_nonzero(np.abs(g) > self.limit))
            np.clip(g, -self.limit, self.limit, out=g)
        return g.astype(np.int64).sum(axis=0), over

    def encode_noise(self, noise: np.ndarray) -> np.ndarray:
        """Noise on the grid (float64 holding integers), never clipped: it is part of what protects the sum."""
        return np.rint(np.asarray(noise, dtype=np.float64) * self.scale)

    def snap_tensor(self, x: torch.Tensor) -> torch.Tensor:  # noqa: F821 - imported inside
        """``decode(encode_noise(x))`` for a float64 tensor on any device, computed where it lives: the same
        values (torch.round rounds half to even like np.rint; a float64 holding an integer decodes as its int64)."""
        import torch  # here: the protocol modules that use this class need no torch

        return torch.round(x.to(torch.float64) * self.scale) / self.scale

    def decode(self, total: np.ndarray) -> np.ndarray:
        """Reals of a sum of encoded vectors (int64, already reduced to the signed range)."""
        return np.asarray(total, dtype=np.int64).astype(np.float64) / self.scale

    def error_bound(self, n: int) -> float:
        """Largest |decoded sum − Σ clipped reals| per coordinate for ``n`` noiseless summands."""
        return n / 2 ** (self.frac_bits + 1)

    def dp_clip(self, clip_norm: float, dim: int) -> float:
        """The L2 norm to clip to so that the rounded integers have norm at most ``clip_norm`` · 2^f."""
        return clip_norm - math.sqrt(dim) / 2 ** (self.frac_bits + 1)

    def check_capacity(self, max_summands: int, modulus_bits: int, field: str, noise_std: float = 0.0) -> None:
        """Fail early if a sum of ``max_summands`` clipped values plus 10σ of noise could leave the signed range of a
        ``modulus_bits``-bit modulus."""
        worst = max_summands * self.limit + 10 * noise_std * self.scale
        if worst >= 2.0 ** (modulus_bits - 1):
            raise BadInputError(
                f"{field}: a sum of {max_summands} values of up to {self.clip_range} at frac_bits {self.frac_bits}"
                f" (plus noise) needs {math.log2(worst) + 1:.1f} bits, more than the {modulus_bits}-bit modulus holds;"
                " lower privacy.secure_aggregation.clip_range or frac_bits"
            )
