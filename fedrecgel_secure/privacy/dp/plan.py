r"""The privacy a policy will spend, before it trains: what ``fedrecgel policy show`` prints under DP.

The same arithmetic as the run's observers (:mod:`.observers`), on the planned rounds at the planned noise: the
release accounted by the policy's accountant over ``federation.rounds`` (per user under cyclic participation, each
user in at most :math:`\lceil R/b \rceil` rounds); the server, which knows who took part, per user without
amplification, at the noise it cannot remove. Under Poisson sampling nothing bounds how many rounds a user is
sampled in, so the plan states the server's ε for a user sampled at the expected rate :math:`qR` and for one
sampled in every round; the run reports the ε of its most exposed user as it happens. Under hidden participation
(:mod:`.hidden`) the server does not know who took part: its ε is the release's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PrivacyPlan:
    """The planned spend of a DP policy over its rounds, at ``delta``."""

    noise_multiplier: float  # z, calibrated from target_epsilon where the policy gives one
    rounds: int
    delta: float
    epsilon: float  # against whoever sees only the released models
    epsilon_server: float  # against the server at the rounds below; inf where it sees the clipped uploads
    server_rounds: float  # the rounds of the user that epsilon_server is for
    epsilon_server_worst: float  # Poisson: a user sampled in every round; else as epsilon_server
    cyclic: bool
    hidden: bool = False  # hidden participation: the server's epsilon is the release's

    def lines(self) -> list[str]:
        """The plan in a few sentences, and what would change it."""
        against = (
            "ε against the server: ∞ (it adds the noise to uploads it sees clipped but bare)"
            if math.isinf(self.epsilon_server)
            else f"ε against the server: {self.epsilon_server:.2f} (hidden participation: it does not know who took"
            " part, the same as against the release)"
            if self.hidden
            else (
                f"ε against the server: {self.epsilon_server:.2f} (a user in at most {self.server_rounds:g} rounds:"
                " nothing amplified, the same as against the release)"
                if self.cyclic
                else f"ε against the server: {self.epsilon_server:.2f} for a user sampled in the expected"
                f" {self.server_rounds:.3g} rounds, {self.epsilon_server_worst:.2f} for one sampled in every round"
            )
        )
        return [
            f"planned privacy over {self.rounds} rounds at δ = {self.delta:g}: noise multiplier z = "
            f"{self.noise_multiplier:.4g}",
            f"ε against the release: {self.epsilon:.2f}",
            against,
            "ε grows with the rounds, the sample rate (under cyclic participation: a user's turns) and 1/z;"
            " target_epsilon calibrates z to the rounds planned",
        ]


def plan_privacy(resolved) -> PrivacyPlan:
    """The plan of a resolved DP configuration (:func:`.resolution.validate_against_population`)."""
    from .pld import gaussian_epsilon

    z, rounds, delta = resolved.noise_multiplier, resolved.rounds, resolved.delta
    expected = max(1, round(resolved.expected_clients))
    server_z = resolved.server_noise_multiplier(expected, expected)
    if resolved.cyclic:
        k = math.ceil(rounds / resolved.period)
        epsilon = gaussian_epsilon(resolved.noise_multiplier / math.sqrt(k), delta)
        server = math.inf if server_z is None else gaussian_epsilon(server_z / math.sqrt(k), delta)
        return PrivacyPlan(z, rounds, delta, epsilon, server, k, server, True)
    accountant = resolved.make_accountant()
    for _ in range(rounds):
        accountant.step(z)
    mean_rounds = resolved.sample_rate * rounds
    if resolved.hidden:
        epsilon = accountant.epsilon()
        return PrivacyPlan(z, rounds, delta, epsilon, epsilon, mean_rounds, epsilon, False, hidden=True)

    def against_server(k: float) -> float:
        return math.inf if server_z is None else gaussian_epsilon(server_z / math.sqrt(max(k, 1e-12)), delta)

    return PrivacyPlan(
        z, rounds, delta, accountant.epsilon(), against_server(mean_rounds), mean_rounds, against_server(rounds), False
    )
