"""The protocol parameters a policy's ``[privacy.secure_aggregation]`` section asks for.

They are built here rather than by the policy models: :mod:`fedrecgel_secure.policy`
knows nothing of the protocols, so reading a policy never imports them
(``privacy`` imports ``policy``, never the reverse). The protocols' parameters are imported
when asked for: a run without secure aggregation never loads TenSEAL or cryptography.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fedrecgel_secure.scheme_facts import facts_of

from .fixedpoint import FixedPoint

if TYPE_CHECKING:
    from fedrecgel_secure.policy import BfvPolicy, DpfPolicy, MaskingPolicy, SecureAggregationPolicy

    from .bfv.params import BFVParams
    from .dpf.params import DPFParams
    from .masking.masks import MaskingParams


def encoding(settings: SecureAggregationPolicy) -> FixedPoint:
    """The fixed-point grid every scheme sums on: ``clip_range`` and ``frac_bits``."""
    return FixedPoint(clip_range=settings.clip_range, frac_bits=settings.frac_bits)


def bfv_params(settings: BfvPolicy) -> BFVParams:
    from .bfv.params import BFVParams

    return BFVParams(
        poly_modulus_degree=settings.poly_modulus_degree,
        coeff_mod_bit_sizes=tuple(settings.coeff_mod_bit_sizes),
        plain_modulus_bits=settings.plain_modulus_bits,
    )


def masking_params(settings: MaskingPolicy) -> MaskingParams:
    from .masking.masks import MaskingParams

    return MaskingParams(degree=settings.degree, threshold=settings.threshold, consistency=settings.consistency)


def dpf_params(settings: DpfPolicy) -> DPFParams:
    """The budget, the values' group and where the servers expand keys; the table's shape is the model's, filled in
    by the trainer."""
    from .dpf.params import DPFParams

    return DPFParams(budget=settings.budget, value_bits=settings.value_bits, device=settings.device)


def norm_bound(policy, reports: int = 0) -> float:
    """The L2 bound a DPF upload proves its norm within (``privacy.secure_aggregation.dpf.norm_check`` with DP):
    √(C² + reports), the update clipped to C and each of the ``reports`` metrics a user reports inside the sum at
    most 1; 0.0 where nothing is checked (the policy refuses the combinations the check cannot run under)."""
    dp, settings = policy.privacy.dp, policy.privacy.secure_aggregation
    checked = dp.enabled and facts_of(settings.scheme).norm_check and settings.dpf.norm_check
    return math.hypot(dp.clip_norm, math.sqrt(reports)) if checked else 0.0
