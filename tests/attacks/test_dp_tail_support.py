"""Attack: a support test on the Gaussian noise's tails.

The adversary sees an exact release on the fixed-point grid and knows the other
clients' sum in one coordinate (the server under BFV with central DP, or
colluding clients). It asks whether the released value is reachable by the
sampler "without the target" (noise = release − others) or only "with" it
(noise = release − others − the target's value). If only one is reachable, it
decides, and it is always right.

A sampler that draws ``ndtri`` of a 53-bit uniform (the project's sampler
before issue 23) leaves grid points unreachable beyond about 4.8σ: there the
test decides about half the time. The project's sampler keeps full precision
in the tails, so up to :func:`gapless_bound` every grid point is reachable and
the test decides nothing.

The sampler is monotone in its random code, so reachability of a grid point is
decided exactly by a binary search over the codes, with the project's own
sampler and rounding (no approximation of either).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrecgel_secure.privacy.dp.randomness import gapless_bound, gaussian_from_words, tail_delta
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint

STD = 0.461  # dp-eps8's central noise z*C
GRID = FixedPoint()
EVENTS = 2000
TAIL = 4.8  # in stds: where the plain 53-bit sampler's outputs start being two grid steps apart


def project_sampler(codes: list[int]) -> torch.Tensor:
    """The project's draws (negative half) for 115-bit codes: word k = code >> 52, tail word from the low 52 bits."""
    k = [c >> 52 for c in codes]
    tail = [(c & ((1 << 52) - 1)) << 12 for c, kk in zip(codes, k, strict=True) if kk < 1 << 52]
    tail = [t - (1 << 64) if t >> 63 else t for t in tail]  # the same 64 bits as a signed word
    tail_words = torch.tensor(tail, dtype=torch.int64)
    return gaussian_from_words(torch.tensor(k, dtype=torch.int64), lambda count: tail_words)


def plain_53_bit_sampler(codes: list[int]) -> torch.Tensor:
    """The sampler before issue 23: ndtri of a 53-bit uniform (k + 1/2) 2^-53."""
    return torch.special.ndtri((torch.tensor(codes, dtype=torch.float64) + 0.5) * 2.0**-53)


SAMPLERS = {"project": (project_sampler, 115), "plain-53-bit": (plain_53_bit_sampler, 53)}


def on_grid(sampler, codes: list[int]) -> np.ndarray:
    """The grid integers the released noise takes for these codes: the project's own rounding."""
    return GRID.encode_noise((sampler(codes) * STD).numpy()).astype(np.int64)


def first_code_at(sampler, bits: int, points: np.ndarray) -> list[int]:
    """The smallest code whose grid value is >= each point (binary search: the draw is monotone in the code)."""
    lo, hi = [0] * len(points), [(1 << bits) - 1] * len(points)
    for _ in range(bits):
        mid = [(a + b) // 2 for a, b in zip(lo, hi, strict=True)]
        above = on_grid(sampler, mid) >= points
        lo = [a if up else m + 1 for a, m, up in zip(lo, mid, above, strict=True)]
        hi = [m if up else b for b, m, up in zip(hi, mid, above, strict=True)]
    return lo


def reachable(sampler, bits: int, points: np.ndarray) -> np.ndarray:
    """Whether some code's draw rounds to each grid integer in ``points``."""
    return on_grid(sampler, first_code_at(sampler, bits, points)) == points


def support_test_decisions(name: str, target_steps: int, tail: float = TAIL) -> int:
    """How often the test decides over EVENTS draws beyond ``tail`` stds, the target adding ``target_steps`` grid steps.

    The target took part, so release − others = noise + target. "Without" needs the sampler to reach
    noise + target; "with" needs noise, which it drew. So the test decides exactly when noise + target
    is unreachable, and is then always right.
    """
    sampler, bits = SAMPLERS[name]
    # the sampler's own law on (-bound, -tail]: uniform codes between the two (beyond the bound is the truncation)
    bound = gapless_bound(STD, 1 / GRID.scale)
    ends = np.array([round(-bound * STD * GRID.scale), round(-tail * STD * GRID.scale)])
    low, high = first_code_at(sampler, bits, ends)
    rng = np.random.default_rng(7)
    draws = [low + (int(rng.integers(0, 1 << 62)) * (high - low) >> 62) for _ in range(EVENTS)]
    noise = on_grid(sampler, draws)
    return int(np.count_nonzero(~reachable(sampler, bits, noise + target_steps)))


def test_the_support_test_decides_on_a_plain_53_bit_sampler():
    """Not vacuous: the same test against the sampler the project used before decides often, and always rightly."""
    assert support_test_decisions("plain-53-bit", 1) > EVENTS // 4


CASES = [(1, TAIL), (2, TAIL), (3, TAIL), (1 << 20, TAIL), (1, 9.5), (1, 10.4)]


@pytest.mark.parametrize(("target_steps", "tail"), CASES)
def test_the_support_test_decides_nothing_on_the_projects_sampler(target_steps, tail):
    assert support_test_decisions("project", target_steps, tail) == 0


def test_the_truncation_lies_far_out_and_its_delta_is_negligible():
    bound = gapless_bound(STD, 1 / GRID.scale)
    assert bound > 10  # dp-eps8's central noise: every grid point within 10 stds is reachable
    assert tail_delta(STD, 1 / GRID.scale, 373_000) < 1e-15  # per release, against delta = 1e-4 for the run
