r"""Epsilon against the server: each user's loss composed over its own rounds, without amplification by sampling.

The accounted :math:`\varepsilon` (:mod:`.accounting`) holds against anyone who
sees only the released models: it counts on nobody knowing who was sampled.
The server knows (in ``distributed`` mode it receives the uploads, or the secure
sum of a cohort it chose). Against it, a user's loss in a round where its upload
reached what the server sees is one Gaussian mechanism of sensitivity :math:`C`
and the noise the server cannot remove, :math:`z_t C`
(:meth:`.resolution.ResolvedDP.server_noise_multiplier`); rounds without the
user cost it nothing. Gaussian mechanisms compose exactly into one Gaussian
mechanism (Dong, Roth, Su 2019): :math:`\mu_u^2 = \sum_{t \ni u} 1/z_t^2`.
So a run keeps, per user, its precision :math:`\sum 1/z_t^2` and number of
rounds (the run's sample log, in the checkpoint), and the server's
:math:`\varepsilon` is that of the most exposed user: the Gaussian mechanism with
noise multiplier :math:`1/\max_u \mu_u`, at the run's :math:`\delta`
(:func:`.pld.gaussian_epsilon`, exact).

At :math:`z = 0.92` and :math:`\delta = 10^{-4}` a user in 10 rounds has
:math:`\varepsilon = 18.0`, in 22 rounds 31.2, where the release is accounted at 8.

Under cyclic participation (``privacy.dp.sampler = "cyclic"``) nothing is amplified, so the release is
accounted the same way, per user (:class:`UserExposure` for both observers): one :math:`\varepsilon` that holds
against the server as against the release.
"""

from __future__ import annotations

import math

import numpy as np
import torch


class UserExposure:
    """Per-user precision :math:`\\sum_t 1/z_t^2` and rounds over what an observer saw (the server; the release,
    under cyclic participation); its worst-case epsilon."""

    def __init__(self, population: int, delta: float):
        self.delta = delta
        self.precision = np.zeros(population, dtype=np.float64)
        self.rounds = np.zeros(population, dtype=np.int64)

    def record(self, users: np.ndarray, noise_multiplier: float) -> None:
        """``users`` (ids) had their uploads in what the server saw, at ``noise_multiplier``."""
        users = np.asarray(users, dtype=np.int64)
        self.precision[users] += 1.0 / noise_multiplier**2
        self.rounds[users] += 1

    def _epsilon(self, precision: float) -> float:
        if precision == 0:
            return 0.0
        from .pld import gaussian_epsilon  # dp-accounting: only when a run is accounted

        return gaussian_epsilon(1.0 / math.sqrt(precision), self.delta)

    @property
    def most_exposed(self) -> int:
        """The user with the largest precision (the most rounds, when every round had the same noise)."""
        return int(np.argmax(self.precision))

    def epsilon(self) -> float:
        r"""The largest :math:`\varepsilon` any user has spent against this observer so far."""
        return self._epsilon(float(self.precision.max(initial=0.0)))

    def rdp_epsilon(self) -> float:
        """The same by RDP (Opacus's conversion), a cross-check: the most exposed user's one Gaussian mechanism."""
        precision = float(self.precision.max(initial=0.0))
        if precision == 0:
            return 0.0
        from .opacus_analysis import rdp_epsilon_of  # opacus: only when a run is accounted

        return rdp_epsilon_of([(1.0 / math.sqrt(precision), 1.0, 1)], self.delta)

    def epsilon_if(self, noise_multiplier: float, users: np.ndarray | None = None) -> float:
        """The largest epsilon after one more round at ``noise_multiplier`` in which ``users`` (default: any
        user, so the most exposed one) reach the server."""
        pool = self.precision if users is None else self.precision[np.asarray(users, dtype=np.int64)]
        return self._epsilon(float(pool.max(initial=0.0)) + 1.0 / noise_multiplier**2)

    def state_dict(self) -> dict:
        return {"precision": torch.from_numpy(self.precision.copy()), "rounds": torch.from_numpy(self.rounds.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.precision = state["precision"].numpy().astype(np.float64, copy=True)
        self.rounds = state["rounds"].numpy().astype(np.int64, copy=True)


class PrivacyLedger:
    """A run's privacy spent against each observer, and the ``max_epsilon`` rule for the one it names.

    ``release``: the accountant of the released models (:class:`.accounting.PrivacyAccountant`), or under cyclic
    participation (``per_user``) a :class:`UserExposure` of the releases, since nothing is amplified.
    ``server``: :class:`UserExposure` of what the server saw, or None where the server sees the clipped uploads
    themselves (central noise it adds itself), or where it knows no more than the release (hidden participation:
    the release's epsilon is reported as the server's). ``privacy.dp.max_epsilon_against`` says which one
    ``max_epsilon`` bounds.
    """

    def __init__(self, resolved):
        self.dp = resolved
        self.per_user = resolved.cyclic
        self.release = (
            UserExposure(resolved.population, resolved.delta) if self.per_user else resolved.make_accountant()
        )
        sees_noise = resolved.server_noise_multiplier(1, 1) is not None
        # hidden participation: the server sees what the release shows, a sum over a sample it does not know, so
        # the release's accountant is its bound too (zero-out adjacency, :mod:`.hidden`)
        self.same_for_server = resolved.hidden
        self.server = UserExposure(resolved.population, resolved.delta) if sees_noise and not resolved.hidden else None
        self.tail_delta = 0.0  # the δ the sampler's truncation added over the releases so far

    @property
    def against_server(self) -> bool:
        """Whether max_epsilon bounds a ledger of the server's own (not the release's, which is the server's
        bound under hidden participation)."""
        return self.dp.max_epsilon is not None and self.dp.max_epsilon_against == "server" and self.server is not None

    def refusal_before(self, round: int, users: np.ndarray | None = None) -> str | None:
        """Why round ``round`` must not start, or None: at its planned noise it could overshoot max_epsilon
        (per user: for the most exposed of ``users``, the round's, or of everyone when they are not known)."""
        from .accounting import BudgetExhausted

        cap, z = self.dp.max_epsilon, self.dp.noise_multiplier
        if cap is None:
            return None
        if self.against_server:
            epsilon, after = self.server.epsilon(), self.server.epsilon_if(z, users)
        elif self.per_user:
            epsilon, after = self.release.epsilon(), self.release.epsilon_if(z, users)
        else:
            epsilon, after = self.release.epsilon(), self.release.epsilon_if_step()
        return None if after <= cap else str(BudgetExhausted(round, epsilon, after, cap, self.dp.max_epsilon_against))

    def refusal(self, participants: int, users: list[int]) -> str | None:
        """Why the sum of ``users``' uploads (of ``participants`` sampled) must not be released, or None."""
        cap = self.dp.max_epsilon
        if cap is None or not users:
            return None
        reached = self.dp.reached_noise_multiplier(participants, len(users))
        if self.against_server:
            after = self.server.epsilon_if(self.dp.server_noise_multiplier(participants, len(users)), users)
            whose = "epsilon against the server"
        elif self.per_user:
            after, whose = self.release.epsilon_if(reached, users), "epsilon"
        else:
            after, whose = self.release.epsilon_if_step(reached), "epsilon"
        if after <= cap:
            return None
        return (
            f"{len(users)} of {participants} sampled uploads arrived (noise multiplier {reached:.4g});"
            f" releasing the sum would bring {whose} to {after:.4g} > privacy.dp.max_epsilon = {cap:g}"
        )

    def commit(self, release_noise: float, participants: int, users: np.ndarray, tail_delta: float = 0.0) -> None:
        """A round was released (or skipped, ``users`` empty): account it at ``release_noise``, and charge
        ``users``, whose uploads the server saw, at what of it the server cannot remove. ``tail_delta``: the
        δ the sampler's truncation adds to this release (the mechanism's ``release_tail_delta``).
        Per user (cyclic participation), a release charges its contributors only: a round without a user's
        upload is independent of its data."""
        if not self.per_user:
            self.release.step(release_noise)
        elif len(users):
            self.release.record(users, release_noise)
        self.tail_delta += tail_delta
        if self.server is not None and len(users):
            self.server.record(users, self.dp.server_noise_multiplier(participants, len(users)))

    def report(self) -> dict:
        """``epsilon`` (the accounted one), ``epsilon_rdp`` (its cross-check), ``epsilon_server`` (None where
        there is no bound against the server) and ``server_rounds`` (the most exposed user's rounds), each at
        ``delta``: the accountant's δ plus ``delta_tail``, what the sampler's truncation added over the releases."""
        server, epsilon = self.server, self.release.epsilon()
        if self.same_for_server:
            epsilon_server, server_rounds = epsilon, None
        else:
            epsilon_server = None if server is None else server.epsilon()
            server_rounds = None if server is None else int(server.rounds[server.most_exposed])
        return {
            "delta": self.dp.delta + self.tail_delta,
            "delta_tail": self.tail_delta,
            "epsilon": epsilon,
            "epsilon_rdp": self.release.rdp_epsilon(),
            "epsilon_server": epsilon_server,
            "server_rounds": server_rounds,
        }

    def state_dict(self) -> dict:
        return {
            "accountant": self.release.state_dict(),
            "tail_delta": self.tail_delta,
            **({} if self.server is None else {"server": self.server.state_dict()}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.release.load_state_dict(state["accountant"])
        self.tail_delta = float(state.get("tail_delta", 0.0))  # checkpoints before it: releases of < 1e-15 each
        if self.server is not None:
            if "server" not in state:  # a checkpoint from before the server's ledger: its past is unknown
                from fedrecgel_secure.errors import BadInputError

                raise BadInputError(
                    "the checkpoint holds no record of which users the server saw (written before epsilon against"
                    " the server was reported); start a new run"
                )
            self.server.load_state_dict(state["server"])
