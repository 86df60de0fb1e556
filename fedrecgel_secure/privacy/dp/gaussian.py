r"""The Gaussian mechanism's pure maths in DP-FedAvg: clipping, noise stds, the fixed denominator.

McMahan et al. 2018, Algorithm 1. Randomness is not drawn here (see
:mod:`.randomness`), so every function is deterministic and easy to check.
Which clients take part is :mod:`.client_sampling`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fedrecgel_secure.checks import FIELD, fractions_sum_to_one, positive
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import Mode

# --------------------------------------------------------------------------- clipping


def clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    r"""Per-client scale :math:`\min(1, C/\lVert\Delta_i\rVert)` that clips each upload to norm :math:`C`.

    Multiplying upload :math:`i` by factor :math:`i` bounds the L2 sensitivity of
    the sum to :math:`C` (McMahan et al. 2018, Alg. 1, ``ClipFn``). Uploads already
    inside the ball get exactly 1, so they pass through bit for bit; a zero upload
    gets 1 rather than a division by zero.
    """
    clip_norm = positive(clip_norm, f"{FIELD}.clip_norm")
    check_norms(norms)
    return torch.where(norms > clip_norm, clip_norm / norms, torch.ones_like(norms))


def split_clip_norms(clip_norm: float, fractions: Mapping[str, float]) -> dict[str, float]:
    r"""Per-group clip norms :math:`C_g = C\sqrt{f_g}` with :math:`\sum_g f_g = 1`.

    Clipping each group :math:`g` (item embeddings, MLP) to :math:`C_g` keeps the
    whole upload within :math:`\sqrt{\sum_g C_g^2} = C`, so the noise calibrated
    for :math:`C` still covers it. The fractions are normalised by their sum so
    rounding in the user's figures cannot push the total above :math:`C`.
    """
    clip_norm = positive(clip_norm, f"{FIELD}.clip_norm")
    fractions_sum_to_one(dict(fractions))
    total = math.fsum(fractions.values())
    return {name: clip_norm * math.sqrt(f / total) for name, f in fractions.items()}


def group_clip_factors(group_norms: torch.Tensor, group_clip: torch.Tensor) -> torch.Tensor:
    r"""Per-client, per-group scale :math:`\min(1, C_g/\lVert\Delta_{i,g}\rVert)`.

    Args:
        group_norms: ``(clients, groups)`` L2 norm of each client's slice of each group.
        group_clip: ``(groups,)`` the :math:`C_g` of :func:`split_clip_norms`.

    Returns:
        ``(clients, groups)`` factors; after scaling, client :math:`i`'s upload has
        norm at most :math:`\sqrt{\sum_g C_g^2}`.
    """
    check_norms(group_norms)
    if group_norms.dim() != 2 or group_clip.shape != group_norms.shape[1:]:
        raise ValueError(
            f"group norms {tuple(group_norms.shape)} and group clip norms {tuple(group_clip.shape)} do not match"
        )
    if not bool(torch.all(group_clip > 0)):
        raise BadInputError(f"{FIELD}: every per-group clip norm must be > 0, got {group_clip.tolist()}")
    group_clip = group_clip.to(group_norms.dtype)
    return torch.where(group_norms > group_clip, group_clip / group_norms, torch.ones_like(group_norms))


def check_norms(norms: torch.Tensor) -> None:
    # A NaN norm would compare False and sail through unclipped; an infinite one
    # would turn the upload into NaNs. Either is a bug upstream, not user input.
    if not bool(torch.all(torch.isfinite(norms) & (norms >= 0))):
        raise ValueError("upload norms must be finite and non-negative")


# --------------------------------------------------------------------------- noise


def noise_std(mode: Mode, noise_multiplier: float, clip_norm: float, participants: int) -> float:
    r"""Std of the Gaussian noise one party adds.

    ``central``: the server adds :math:`\sigma = zC` to the sum once.
    ``distributed``: each of the round's ``participants`` :math:`|S|` adds
    :math:`\sigma = zC/\sqrt{|S|}` to its upload, so the shares of all of them
    sum to std :math:`zC` (variances add). If only :math:`|U| \le |S|` of them
    reach the sum, it carries :math:`zC\sqrt{|U|/|S|}`: see :func:`reached_noise_multiplier`.

    The same rule serves the clipped-count query of adaptive clipping with its
    own noise multiplier and sensitivity.
    """
    z = positive(noise_multiplier, f"{FIELD}.noise_multiplier")
    c = positive(clip_norm, f"{FIELD}.clip_norm")
    if mode == "central":
        return z * c
    if mode != "distributed":
        raise BadInputError(f"{FIELD}.mode must be 'central' or 'distributed', got {mode!r}")
    if participants < 1:
        raise ValueError(
            "distributed noise needs at least one client to add it; with nobody sampled the server adds z*C"
        )
    return z * c / math.sqrt(participants)


def reached_noise_multiplier(mode: Mode, noise_multiplier: float, shares: int, contributors: int) -> float:
    r"""The noise multiplier of what reached the sum: :math:`z\sqrt{|U|/k}` for distributed shares, else :math:`z`.

    Each distributed share has std :math:`zC/\sqrt{k}` (:func:`noise_std` with
    :math:`k` = ``shares``: the number sampled, or a survivor threshold), so the
    :math:`|U|` that reach the sum carry :math:`zC\sqrt{|U|/k}`: less than planned
    when shares leave with clients that drop out or are rejected, more when more
    than :math:`k` arrive. This is what the round must be accounted with. With
    nobody sampled (:math:`k = 0`) the server adds the full :math:`zC` itself.
    """
    if mode == "central" or shares == 0:
        return noise_multiplier
    if contributors < 0 or shares < 0:
        raise ValueError(f"{contributors} contributors of noise shares sized for {shares}")
    return noise_multiplier * math.sqrt(contributors / shares)


def fixed_denominator_mean(noisy_sum: torch.Tensor, expected_clients: float) -> torch.Tensor:
    r"""The DP-FedAvg aggregate :math:`(\sum_i \mathrm{clip}(\Delta_i) + \text{noise}) / m`.

    :math:`m = qN` is fixed in advance (McMahan et al. 2018, the "fixed
    denominator" estimator). Dividing by the realised :math:`|S|` instead would
    make the output depend on :math:`|S|`, which the Poisson analysis keeps
    secret, and one client's removal would change the scale of everyone's
    contribution, so the sensitivity would no longer be :math:`C/m`.
    """
    if not expected_clients > 0:
        raise ValueError(f"expected clients per round must be > 0, got {expected_clients!r}")
    return noisy_sum / expected_clients
