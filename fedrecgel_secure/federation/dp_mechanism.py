"""The DP mechanism of one party: clipping, the clipped bit and the Gaussian noise, sized and drawn once C is known.

One object per run (the simulator's :class:`~.dp_aggregation.DPFedAvg` owns it) or per node (a deployment's
node runs its users' part with it, the BFV key holder the central noise). The maths it applies are the pure
functions of :mod:`fedrecgel_secure.privacy.dp.gaussian`; the settings and the noise multipliers the accounting
reads are :class:`~fedrecgel_secure.privacy.dp.resolution.ResolvedDP`'s. It spends no privacy, so it builds no
accountant.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedrecgel_secure.federation.reports import with_reports
from fedrecgel_secure.federation.summers import Contributions
from fedrecgel_secure.federation.uploads import GROUPS, Uploads
from fedrecgel_secure.privacy.dp import gaussian
from fedrecgel_secure.privacy.dp.adaptive import AdaptiveClipping, clipped_bits
from fedrecgel_secure.privacy.dp.randomness import DPRandomness, tail_delta
from fedrecgel_secure.privacy.dp.resolution import ResolvedDP
from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint


class DPMechanism:
    """DP-FedAvg's clipping and noise, without the accountant: what each party computes once C is known.

    :meth:`protect` is the clients' part (clip, clipped bit, noise share) and
    :meth:`central_noise` the one noise of central mode. :class:`DPFedAvg` runs
    both in the simulator; a deployment's node runs :meth:`protect` for its own
    users, and the BFV key holder :meth:`central_noise`, each with the settings
    of its own policy. Neither spends privacy, so neither builds an Opacus
    accountant (seconds per call).

    Every draw is bound to its round and attempt (:mod:`.randomness`): a caller
    that names no attempt gets the next one of that round for this mechanism,
    so one mechanism asked twice for a round's noise (a node or key holder that
    keeps its mechanism between a server's requests) never hands out the same
    noise twice; the first is attempt 0, what the simulator draws.
    """

    def __init__(self, resolved: ResolvedDP, grid: FixedPoint, randomness: DPRandomness):
        self.dp, self.grid, self.randomness = resolved, grid, randomness
        self._attempts: dict[int, int] = {}  # round -> attempts begun: the one counter of the party's draws

    def begin_attempt(self, round_idx: int) -> int:
        """A new attempt of round ``round_idx``: its number (0 for the first)."""
        self._attempts[round_idx] = self._attempts.get(round_idx, 0) + 1
        return self._attempts[round_idx] - 1

    def current_attempt(self, round_idx: int) -> int:
        """The attempt of round ``round_idx`` begun last (0 before any)."""
        return max(0, self._attempts.get(round_idx, 0) - 1)

    def forget_rounds_until(self, round_idx: int) -> None:
        """Drop the counts of rounds up to ``round_idx`` (released: none of them is drawn again)."""
        self._attempts = {r: n for r, n in self._attempts.items() if r > round_idx}

    def _attempt(self, round_idx: int, attempt: int | None) -> int:
        if attempt is None:
            return self.begin_attempt(round_idx)
        self._attempts[round_idx] = max(self._attempts.get(round_idx, 0), attempt + 1)
        return attempt

    # The noise each party adds, sized from the resolved settings (the sizes are the mechanism's, the settings
    # and the accounting's noise multipliers :class:`ResolvedDP`'s).

    def update_noise_std(self, clip_norm: float, participants: int) -> float:
        """Std one party adds to the updates this round (see :func:`.gaussian.noise_std`)."""
        dp = self.dp
        return gaussian.noise_std(dp.mode, dp.update_noise_multiplier, clip_norm, dp.noise_shares(participants))

    def report_noise_std(self, participants: int) -> float:
        """Std one party adds to each reported metric this round (evaluation.scope = "round" only)."""
        dp = self.dp
        assert dp.report_noise_multiplier is not None
        sensitivity = math.sqrt(dp.reports)  # each of the metrics in [0, 1]
        return gaussian.noise_std(dp.mode, dp.report_noise_multiplier, sensitivity, dp.noise_shares(participants))

    def count_noise_std(self, participants: int) -> float:
        """Std one party adds to the centred clipped count this round (adaptive clipping only)."""
        dp = self.dp
        z_b = AdaptiveClipping.count_noise_multiplier_for(dp.clipped_count_stddev)
        return gaussian.noise_std(dp.mode, z_b, AdaptiveClipping.COUNT_SENSITIVITY, dp.noise_shares(participants))

    def release_tail_delta(self, clip_norm: float, dim: int, participants: int, contributors: int) -> float:
        r"""The δ the sampler's truncation adds to one release: the chance that any noise draw in it lies beyond
        its :func:`.randomness.gapless_bound` on this grid (:func:`.randomness.tail_delta`, a union bound over
        the draws).

        The draws are the central noise (std :math:`z_\Delta C` on ``dim`` values, and
        :math:`\sigma_b` on the clipped count) in central mode or when nobody was sampled
        (``participants`` = 0), else the ``contributors``' shares that reached the sum.
        """
        dp = self.dp
        if dp.mode == "central" or participants == 0:
            draws = [(gaussian.noise_std("central", dp.update_noise_multiplier, clip_norm, 1), dim)]
            if dp.adaptive is not None:
                draws.append((dp.clipped_count_stddev, 1))
            if dp.reports:
                draws.append((self.report_noise_std(1), dp.reports))
        else:
            draws = [(self.update_noise_std(clip_norm, participants), dim * contributors)]
            if dp.adaptive is not None:
                draws.append((self.count_noise_std(participants), contributors))
            if dp.reports:
                draws.append((self.report_noise_std(participants), dp.reports * contributors))
        step = 1.0 / self.grid.scale
        return math.fsum(tail_delta(std, step, n) for std, n in draws if n > 0)

    @property
    def extra(self) -> int:
        """Coordinates appended to every upload: the clipped bit under adaptive clipping, then the reported
        metrics under evaluation.scope = "round" (:mod:`..reports`)."""
        return (0 if self.dp.adaptive is None else 1) + self.dp.reports

    def clip(self, uploads: Uploads, dim: int, clip_norm: float) -> tuple[Uploads, torch.Tensor]:
        """Clipped uploads and the unclipped norms (the clipped bit needs those).

        The clip norm is C (``clip_norm``) minus the rounding slack of the
        fixed-point grid (:meth:`FixedPoint.dp_clip`), so that the integers each
        client hands over still have norm at most C on the grid.
        """
        clip_norm = self.grid.dp_clip(clip_norm, dim)
        group_sq = uploads.group_sq_norms()
        norms = group_sq.sum(1).sqrt()
        if self.dp.group_fractions is None:
            return uploads.scale(gaussian.clip_factors(norms, clip_norm)), norms
        budget = gaussian.split_clip_norms(clip_norm, self.dp.group_fractions)
        group_clip = torch.tensor([budget[g] for g in GROUPS], dtype=group_sq.dtype, device=group_sq.device)
        return uploads.scale_groups(gaussian.group_clip_factors(group_sq.sqrt(), group_clip)), norms

    def protect(
        self,
        round_idx: int,
        clients: np.ndarray,
        uploads: Uploads,
        dim: int,
        dtype,
        *,
        participants: int,
        clip_norm: float,
        attempt: int | None = None,
    ) -> Contributions:
        """What each client hands over: its clipped upload (plus its clipped bit) and, distributed, its noise share.

        ``clip_norm`` is the round's C and ``participants`` the number of
        clients sampled (it sizes the share z*C/sqrt(participants)). The
        simulator runs this for every sampled client; a deployment's node runs
        it for the ones it hosts. ``attempt``: the round's attempt the shares
        are bound to (default: this mechanism's next one for the round).
        """
        attempt = self._attempt(round_idx, attempt)
        clipped, norms = self.clip(uploads, dim, clip_norm)
        bits = None if self.dp.adaptive is None else clipped_bits(norms, clip_norm)
        if (uploads.reports is None) != (self.dp.reports == 0):
            raise ValueError(f"uploads with reports need a mechanism that noises {self.dp.reports} of them")

        def vector(pos: int) -> torch.Tensor:
            v = clipped.vector(pos)
            return v if bits is None else torch.cat([v, bits[pos : pos + 1].to(v.dtype)])

        def total() -> torch.Tensor:
            t = clipped.total()
            return t if bits is None else torch.cat([t, bits.sum().reshape(1).to(t.dtype)])

        def add_grid_values(grid: FixedPoint, positions: np.ndarray, g: torch.Tensor) -> None:
            clipped.add_grid_values(grid, positions, g)
            if bits is not None:  # vector()'s last value, cast as it casts it
                bit = bits[torch.as_tensor(positions, device=bits.device)].to(clipped.vector_dtype)
                g[:, dim] += torch.round(bit.to(torch.float64) * grid.scale).cpu()

        def grid_total(grid: FixedPoint, positions: np.ndarray, stop: int):  # the uploads' own, and the bits
            if bits is None or stop <= dim:
                return clipped.grid_total(grid, positions, stop)
            fast = clipped.grid_total(grid, positions, dim)
            if fast is None:
                return None
            picked = bits[torch.as_tensor(positions, device=bits.device)].to(clipped.vector_dtype)
            ints, over = grid.encode(picked.double().cpu().numpy())
            return np.concatenate([fast[0], ints.sum(keepdims=True)]), fast[1] + over

        noise = noises = summed_noise = None
        if self.dp.mode == "distributed":
            draws = self._share_parts(dim, clip_norm, participants, counted=bits is not None)
            noise, noises, summed_noise = self._noise_shares(round_idx, clients, attempt, draws)

        size = dim + self.extra - self.dp.reports
        own = Contributions(
            clients, size, dtype, vector, noise, total, grid_total, noises, add_grid_values, clipped.vector_dtype
        )
        own.summed_noise = summed_noise
        return with_reports(own, uploads.reports)

    def _share_parts(
        self, dim: int, clip_norm: float, participants: int, *, counted: bool
    ) -> list[tuple[str, int, float]]:
        """A client's distributed noise share in parts, each (stream, length, std): update, clipped bit, reports."""
        draws = [("update-share", dim, self.update_noise_std(clip_norm, participants))]
        if counted:
            draws.append(("count-share", 1, self.count_noise_std(participants)))
        if self.dp.reports:
            draws.append(("report-share", self.dp.reports, self.report_noise_std(participants)))
        return draws

    def _noise_shares(self, round_idx: int, clients: np.ndarray, attempt: int, draws: list[tuple[str, int, float]]):
        """The round's noise shares as ``(noise, noises, summed_noise)``: per client and in rows, or only summed."""
        if self.dp.simulate_shares == "summed":  # a study mode: not the protocol's bits

            def summed_noise(positions: np.ndarray) -> torch.Tensor:  # k shares of std s sum to one of std s·sqrt(k)
                k = float(np.asarray(positions).size) ** 0.5
                parts = [
                    self.randomness.normal(f"{d}-sum", round_idx, 0, n, s * k, attempt=attempt) for d, n, s in draws
                ]
                return parts[0] if len(parts) == 1 else torch.cat(parts)

            return None, None, summed_noise

        def noise(pos: int) -> torch.Tensor:  # drawn by the client, with its own key in a deployment
            cid = int(clients[pos])
            parts = [self.randomness.normal(d, round_idx, cid, n, std, attempt=attempt) for d, n, std in draws]
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        def noises(positions: np.ndarray) -> torch.Tensor:  # noise's rows, drawn in one pass (the simulator's)
            cids = np.asarray(clients)[positions]
            draw = self.randomness.normal_rows
            parts = [draw(d, round_idx, cids, n, std, attempt=attempt) for d, n, std in draws]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

        return noise, noises, None

    def central_noise(
        self, round_idx: int, dim: int, clip_norm: float, attempt: int | None = None, device=None
    ) -> torch.Tensor:
        """The full noise, added once to the sum: std z*C on the update (and sigma_b on the clipped count, and the
        reports' std on each reported metric), for
        ``attempt`` of the round (default: this mechanism's next one for the round), made on ``device``."""
        attempt = self._attempt(round_idx, attempt)
        std = gaussian.noise_std("central", self.dp.update_noise_multiplier, clip_norm, 1)
        draws = [("update-noise", dim, std)]
        if self.dp.adaptive is not None:
            draws.append(("count-noise", 1, self.dp.clipped_count_stddev))
        if self.dp.reports:
            draws.append(("report-noise", self.dp.reports, self.report_noise_std(1)))
        parts = [self.randomness.normal(d, round_idx, 0, n, s, attempt=attempt, device=device) for d, n, s in draws]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
