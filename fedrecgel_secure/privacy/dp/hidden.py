r"""Hidden participation: each node draws its own users' Poisson sample, and works the same whoever was drawn.

Under ``privacy.dp.participation = "hidden"`` the server sends every round's
train message to every node and names every user; a node draws which of its
users take part from its own secret (Poisson at rate :math:`q`, the same
uniform draw per user the simulator makes), trains those, and every other
user of the node adds zeros inside the secure sum. So the reply, its size, its
signatures and the users it names are the same whatever the draw, and Poisson
amplification holds against the server as against the release.

Work. A node's training time grows with how many users it trains, so it trains
a fixed number :math:`T` of users every round (:func:`training_slots`): its
drawn users, and as many *ghosts* as fill the slots (:func:`fill_slots`), users
of the node that were not drawn, trained and discarded. Given the draw's size
:math:`c \le T`, the drawn users are a uniform :math:`c`-subset of the node and
the ghosts a uniform :math:`(T - c)`-subset of the rest, so the trained set is a
uniform :math:`T`-subset of the node whatever :math:`c` is: the count the
timing could show is :math:`T`, public. What timing can still show is which
:math:`T` users were trained, through their data sizes (the trained set
contains the draw); a run does not account for that channel.

Overflow. :math:`T` is the smallest count that a Binomial(:math:`n`,
:math:`q`) draw exceeds with probability at most :data:`OVERFLOW` (exact
binomial tail). In the rare round that draws more, the :math:`T` drawn users of
smallest uniform draw train and the others sit the round out; the run's
mechanism differs from Poisson sampling only on that event, so each round adds
:data:`OVERFLOW` to the run's :math:`\delta` (a user belongs to one node).

Pure functions of the uniform draws (:class:`.randomness.DPRandomness`), like :mod:`.client_sampling`.
"""

from __future__ import annotations

import numpy as np

from fedrecgel_secure.checks import FIELD, open_unit

OVERFLOW = 2.0**-30
"""The chance, per node and round, that the draw exceeds the node's training slots: each round adds it to δ."""


def training_slots(users: int, rate: float, overflow: float = OVERFLOW) -> int:
    r"""T: the smallest :math:`t` with :math:`P(\mathrm{Bin}(n, q) > t) \le` ``overflow``, for a node of ``users``
    (:math:`n`) at rate ``rate`` (:math:`q`); at most :math:`n`."""
    if users < 0:
        raise ValueError(f"a node has at least 0 users, got {users!r}")
    rate = open_unit(rate, f"{FIELD}.sample_rate", closed_right=True)
    if users == 0:
        return 0
    from scipy.stats import binom

    t = int(binom.isf(overflow, users, rate))  # a quantile: P(X > t) <= overflow, up to scipy's rounding
    while t > 0 and binom.sf(t - 1, users, rate) <= overflow:
        t -= 1
    while binom.sf(t, users, rate) > overflow:
        t += 1
    return min(users, t)


def node_draw(uniforms: np.ndarray, rate: float, slots: int) -> np.ndarray:
    """Positions (in the node's user order) of the users drawn this round: each with ``uniforms[i] < rate``, and on
    overflow only the ``slots`` of smallest draw. Sorted ``int64``."""
    uniforms = np.asarray(uniforms)
    drawn = np.flatnonzero(uniforms < rate)
    if drawn.size > slots:
        drawn = np.sort(drawn[np.argsort(uniforms[drawn], kind="stable")[:slots]])
    return drawn.astype(np.int64)


def fill_slots(drawn: np.ndarray, ranks: np.ndarray, slots: int) -> np.ndarray:
    """The ghosts: positions of ``slots - len(drawn)`` users not drawn, those of smallest ``ranks`` (one uniform
    draw each, independent of the draw's), so that a uniform draw and its ghosts are a uniform ``slots``-subset."""
    ranks = np.asarray(ranks)
    free = np.setdiff1d(np.arange(ranks.size), drawn)
    need = max(0, slots - int(np.asarray(drawn).size))
    return np.sort(free[np.argsort(ranks[free], kind="stable")[:need]]).astype(np.int64)


def node_sample(randomness, round_idx: int, population: int, users: np.ndarray, rate: float):
    """(drawn, ghosts): user ids of one node's ``users`` drawn in round ``round_idx``, and those that fill its
    training slots, from ``randomness`` (:class:`.randomness.DPRandomness`): draws ``"sample"`` (the simulator's
    Poisson draw, one uniform per user of the population) and ``"ghosts"``. The simulator and a node call this
    alike, so a seeded deployment draws what the simulator draws."""
    users = np.asarray(users, dtype=np.int64)
    slots = training_slots(users.size, rate)
    drawn = node_draw(randomness.uniform("sample", round_idx, 0, population).numpy()[users], rate, slots)
    ghosts = fill_slots(drawn, randomness.uniform("ghosts", round_idx, 0, population).numpy()[users], slots)
    return users[drawn], users[ghosts]
