"""The masking protocol's consistency threshold, the one rule its parties and the DP noise shares count survivors by.

It lives beside, not inside, :mod:`.secagg` and :mod:`.dp`: the protocol
(:meth:`~fedrecgel_secure.privacy.secagg.masking.masks.MaskingParams.consistency_threshold`) and the size of a
distributed noise share under ``privacy.dp.shares = "threshold"``
(:meth:`~fedrecgel_secure.privacy.dp.resolution.ResolvedDP.noise_shares`) both read it, and the DP code imports
nothing of the secure-aggregation code.
"""

from __future__ import annotations

import math


def consistency_threshold(consistency: float, n: int) -> int:
    """T = ⌊f·n⌋ + 1 (at most n): the signatures on one survivor set a client needs before it releases shares,
    for f = ``consistency`` and a cohort of ``n``."""
    return min(n, math.floor(consistency * n + 1e-9) + 1)
