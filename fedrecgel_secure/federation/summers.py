"""Summers: how an aggregation rule adds up its clients' vectors, and what the server sees while it does.

* :class:`PlainSum`: the server adds the uploads in the clear and sees every one of them;
* :class:`SecureSum`: the vectors go through a secure-aggregation protocol
  (:mod:`fedrecgel_secure.privacy.secagg`) and the server learns their sum alone.

Both follow :class:`Summer`: keyword arguments in, a :class:`SumResult` out.
Under DP, every value either releases is on the fixed-point grid
(:mod:`fedrecgel_secure.privacy.secagg.fixedpoint`); :func:`grid_sum` is that
exact sum computed without cryptography.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fedrecgel_secure.privacy.secagg.fixedpoint import FixedPoint
from fedrecgel_secure.privacy.secagg.schemes import scheme_of
from fedrecgel_secure.privacy.secagg.settings import encoding

log = logging.getLogger("fedrecgel_secure.secagg")

Admit = Callable[[list[int]], "str | None"]


@dataclass(frozen=True)
class SecAggCost:
    """What one round of a protocol cost: the clients' mean time and upload, the server's times."""

    client_seconds: float
    upload_bytes: float
    aggregate_seconds: float
    finalize_seconds: float

    @property
    def server_seconds(self) -> float:
        return self.aggregate_seconds + self.finalize_seconds


@dataclass
class Contributions:
    """What a round's clients hand to the summer, one entry per client position."""

    clients: np.ndarray  # the clients' ids
    dim: int
    dtype: torch.dtype
    vector: Callable[[int], torch.Tensor]  # position -> that client's vector, made on demand
    noise: Callable[[int], torch.Tensor] | None = None  # position -> its DP noise share (float64), if it adds one
    total: Callable[[], torch.Tensor] | None = None  # a faster plaintext sum of the vectors, when there is one
    # a faster exact grid sum of the given positions' vectors up to a prefix (Uploads.grid_total), when there is one
    grid_total: Callable[[FixedPoint, np.ndarray, int], tuple[np.ndarray, int] | None] | None = None
    # the batched twins of noise and vector, for noised_grid_sum: positions -> their noise shares (k, dim) float64,
    # row i position i's share; and (grid, positions, g) adding each position's unclipped grid values to its row of
    # g (Uploads.add_grid_values)
    noises: Callable[[np.ndarray], torch.Tensor] | None = None
    add_grid_values: Callable[[FixedPoint, np.ndarray, torch.Tensor], None] | None = None
    vector_dtype: torch.dtype | None = None  # vector's dtype, which the values appended to it are cast to
    # study mode (privacy.dp.simulate_shares = "summed"): positions -> one draw of their shares' sum, for grid_sum alone
    summed_noise: Callable[[np.ndarray], torch.Tensor] | None = None

    @property
    def noised(self) -> bool:
        """Whether the clients' contributions carry noise shares (each its own, or drawn as their sum)."""
        return self.noise is not None or self.summed_noise is not None

    def batched(self) -> bool:
        """Whether :func:`noised_grid_sum` can encode these contributions a chunk of clients at a time."""
        return self.noise is not None and self.noises is not None and self.add_grid_values is not None


@dataclass(frozen=True)
class SumResult:
    """A round's sum, or why there is none, and what the protocol reports about it."""

    total: torch.Tensor | None  # None: the round was skipped
    contributors: np.ndarray  # positions of the clients whose vectors are in the total
    skipped: str | None = None
    cost: SecAggCost | None = None  # None: no protocol ran
    rejected: int = 0  # payloads the protocol refused
    dropped: int = 0  # clients simulated as going silent after masking
    clipped_values: int = 0  # values the fixed-point range clipped


class Summer(Protocol):
    def __call__(
        self,
        round_idx: int,
        contributions: Contributions,
        *,
        central_noise: torch.Tensor | None = None,
        admit: Admit | None = None,
    ) -> SumResult:
        """The sum of the contributions (plus noise shares and ``central_noise``); ``admit(client ids)`` may veto
        the release once the contributors are known."""
        ...


def _refused(admit: Admit | None, ids: list[int]) -> str | None:
    return None if admit is None else admit(ids)


def encode_contribution(grid: FixedPoint, contributions: Contributions, pos: int, part: slice):
    """A client's integers on the grid, as the client itself encodes them: ``part`` of its vector plus its noise
    share; and how many of them were clipped."""
    share = None if contributions.noise is None else contributions.noise(pos)[part].numpy()
    return grid.encode(contributions.vector(pos)[part].double().cpu().numpy(), share)


# values of one chunk of noised_grid_sum: 8 MiB a float64 buffer, so a round's peak stays bounded whatever its size (on
# FilmTrust 2^20 to 2^22 values a chunk, or one client at a time, all ran within 10% of one another)
CHUNK_VALUES = 1 << 20


def noised_grid_sum(grid: FixedPoint, contributions: Contributions, positions, part: slice) -> tuple[np.ndarray, int]:
    """Σ ``encode_contribution`` over ``positions`` (int64) and the values clipped, a chunk of clients at a time.

    Row i of a chunk is what client i encodes: rint(share · 2^f) (one Gaussian pass over the chunk's shares,
    :meth:`DPRandomness.normal_rows`) plus rint(vector · 2^f) where its vector is not zero, clipped value by value;
    the integers are then added. The same bits as the loop over clients (``tests/federation/test_noised_sum.py``).
    """
    positions = np.asarray(positions, dtype=np.int64)
    total, clipped = np.zeros(len(range(*part.indices(contributions.dim))), dtype=np.int64), 0
    step = max(1, CHUNK_VALUES // max(contributions.dim, 1))
    for start in range(0, positions.size, step):
        chunk = positions[start : start + step]
        g = contributions.noises(chunk).mul_(grid.scale).round_()  # encode_noise: rint(share · 2^f)
        contributions.add_grid_values(grid, chunk, g)
        ints, over = grid.clip_sum(g[:, part].numpy())
        total += ints
        clipped += over
    return total, clipped


def grid_sum(
    grid: FixedPoint,
    contributions: Contributions,
    positions,
    central_noise: torch.Tensor | None,
    part: slice,
    restrict: Callable[[np.ndarray], tuple[np.ndarray, int]] | None = None,
) -> tuple[torch.Tensor, int]:
    """The exact fixed-point sum of ``part`` of each contribution (plus its noise share) and of ``central_noise``.

    This is what any exact secure-aggregation scheme releases, computed without
    cryptography: each client's integers ``encode(vector + share)``, summed, plus
    the central noise on the grid. Returns the decoded sum and how many values
    the grid's range clipped. ``restrict`` is what a sparse scheme does to each
    client's integers before they leave it (:meth:`DPFParams.restrict`: the
    rows past its budget zeroed).
    """
    total, clipped = None, 0
    start, stop, step = part.indices(contributions.dim)
    if contributions.summed_noise is not None:  # the study mode: the shares' sum is one more draw, like central noise
        positions = np.asarray(positions, dtype=np.int64)
        summed = contributions.summed_noise(positions) if positions.size else torch.zeros(contributions.dim)
        summed = summed if central_noise is None else summed + central_noise.double().cpu()
        return grid_sum(grid, dataclasses.replace(contributions, summed_noise=None), positions, summed, part, restrict)
    fast = None
    plain = restrict is None and contributions.noise is None  # each client's integers are its vector's, as encoded
    if plain and contributions.grid_total is not None and start == 0 and step == 1:
        fast = contributions.grid_total(grid, np.asarray(positions, dtype=np.int64), stop)
    elif restrict is None and contributions.batched():
        fast = noised_grid_sum(grid, contributions, positions, part)
    if fast is not None:
        total, clipped = fast
        positions = ()
    for pos in positions:
        ints, over = encode_contribution(grid, contributions, int(pos), part)
        if restrict is not None:
            ints = restrict(ints)[0]
        total = ints if total is None else total + ints
        clipped += over
    if central_noise is not None:
        noise = grid.encode_noise(central_noise[part].cpu().numpy()).astype(np.int64)
        total = noise if total is None else total + noise
    if total is None:
        return torch.zeros(len(range(start, stop, step)), dtype=contributions.dtype), clipped
    return torch.from_numpy(grid.decode(total)).to(contributions.dtype), clipped


class PlainSum:
    """The server adds the uploads in the clear: it sees every one of them.

    Without DP noise this is the authors' float sum. With noise, every value the
    server sees is on the fixed-point grid: each client's noised upload
    (distributed), or the noised sum (central), so that no low-order bits of
    the floating-point sampler are released (see :mod:`fedrecgel_secure.privacy.dp.randomness`).
    """

    def __init__(self, grid: FixedPoint):
        self.grid = grid

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        positions = np.arange(contributions.clients.size)
        reason = _refused(admit, [int(c) for c in contributions.clients])
        if reason is not None:
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=reason)
        if contributions.noised:
            total, clipped = grid_sum(self.grid, contributions, positions, central_noise, slice(None))
            return SumResult(total, positions, clipped_values=clipped)
        if contributions.total is not None:
            total = contributions.total()
        else:
            total = sum(
                (contributions.vector(c) for c in positions), torch.zeros(contributions.dim, dtype=contributions.dtype)
            )
        if central_noise is not None:  # the noised sum, snapped to the grid where it is
            total = self.grid.snap_tensor(total.double() + central_noise.to(total.device)).to(contributions.dtype)
        return SumResult(total, positions)


class _LazyVectors(Mapping):
    """client id -> float64 numpy slice of a per-position vector, made when the protocol asks for it."""

    def __init__(self, clients: np.ndarray, make: Callable[[int], torch.Tensor], covered: int):
        self.make, self.covered = make, covered
        self.position = {int(cid): pos for pos, cid in enumerate(clients)}

    def __getitem__(self, cid):
        return self.make(self.position[cid])[: self.covered].double().cpu().numpy()

    def __iter__(self):
        return iter(self.position)

    def __len__(self):
        return len(self.position)


class SecureSum:
    """Sums through secure aggregation: the server learns only the sum of >= min_clients uploads.

    ``covered`` leading coordinates of each contribution go through the protocol
    (all of them by default; the item table alone with ``cover = "item_embeddings"``);
    the rest, if any, is summed in the clear over the same contributors. Noise
    shares and central noise land on the protocol's fixed-point grid.

    Faults are simulated from a stream seeded by the run seed and the round,
    so they never change training draws: ``dropout`` of the clients go silent
    after masking, then ``tampered`` of the others have their upload altered
    in transit (one byte flipped, so its signature fails and the aggregator
    refuses it). The same stream gives masking's public round seed, which fixes
    its neighbour graph.

    ``simulation = "protocol"`` runs every role with its real cryptography
    (:class:`~fedrecgel_secure.privacy.secagg.SecAggSession`) and reports its
    cost; ``"arithmetic"`` decides who contributes with the protocol's own checks
    (:mod:`fedrecgel_secure.privacy.secagg.arithmetic`) and adds their integers
    with :func:`grid_sum`. Both schemes are exact, so the two modes release the
    same bits (``tests/secagg/test_secagg_arithmetic.py``).
    """

    def __init__(self, settings, n_clients: int, dim: int, covered: int, seed: int, table=None, norm_bound=0.0):
        self.settings, self.dim, self.covered, self.seed = settings, dim, covered, seed
        self.grid = encoding(settings)
        scheme = scheme_of(settings)
        self.params = scheme.params(settings)
        self.restrict = None
        if scheme.sparse:  # the item table (rows, width) leads every vector
            rows, width = table if table is not None else (covered, 1)
            bound = {"norm_bound": norm_bound} if scheme.norm_check else {}
            self.params = dataclasses.replace(self.params, rows=rows, width=width, **bound)
            self.params.check(covered, self.grid, n_clients)
            self.restrict = self.params.restrict
        self.arithmetic = settings.simulation == "arithmetic"
        self.session = None
        if not self.arithmetic:
            from fedrecgel_secure.privacy.secagg import make_session

            self.session = make_session(
                settings.scheme,
                covered,
                range(n_clients),
                min_clients=settings.min_clients,
                params=self.params,
                encoding=self.grid,
                workers=settings.worker_count(),
            )

    def close(self) -> None:
        """Stop the protocol's client worker processes, if any."""
        if self.session is not None:
            self.session.close()

    def faults(self, round_idx: int, clients: np.ndarray) -> tuple[set[int], set[int], bytes]:
        """(silent after masking, tampered in transit, masking round seed) of one round, by client id."""
        rng = np.random.default_rng([self.seed, round_idx])
        dropped, tampered = set(), set()
        if self.settings.dropout > 0 and clients.size:
            dropped = {
                int(c) for c in rng.choice(clients, size=int(self.settings.dropout * clients.size), replace=False)
            }
        rest = np.array([c for c in clients if int(c) not in dropped], dtype=np.int64)
        if self.settings.tampered > 0 and rest.size:
            tampered = {int(c) for c in rng.choice(rest, size=int(self.settings.tampered * rest.size), replace=False)}
        # The round seed is public in the protocol (the aggregator announces it); drawing it here lets the
        # arithmetic mode rebuild the same graph.
        round_seed = np.random.default_rng([self.seed, round_idx, 1]).bytes(16)
        return dropped, tampered, round_seed

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None) -> SumResult:
        from fedrecgel_secure.privacy.secagg import RoundSkipped

        clients = contributions.clients
        dropped, tampered, round_seed = self.faults(round_idx, clients)
        run = self._arithmetic if self.arithmetic else self._protocol
        try:
            ids, total, clipped, rejected, cost = run(
                round_idx, contributions, central_noise, admit, dropped, tampered, round_seed
            )
        except RoundSkipped as skipped:
            log.warning("round %d skipped: %s", round_idx, skipped)
            return SumResult(None, np.zeros(0, dtype=np.int64), skipped=str(skipped), dropped=len(dropped))
        position = {int(cid): pos for pos, cid in enumerate(clients)}
        contributors = np.array(sorted(position[c] for c in ids), dtype=np.int64)
        if self.covered < contributions.dim:  # the uncovered part, summed in the clear over the same contributors
            if not contributions.noised and central_noise is None:
                rest = sum(
                    (contributions.vector(int(c))[self.covered :].cpu() for c in contributors),
                    torch.zeros(contributions.dim - self.covered, dtype=contributions.dtype),
                )
            else:
                rest, over = grid_sum(self.grid, contributions, contributors, central_noise, slice(self.covered, None))
                clipped += over
            total = torch.cat([total, rest])
        return SumResult(
            total,
            contributors,
            cost=cost,
            rejected=rejected,
            dropped=len(dropped),
            clipped_values=clipped,
        )

    def _protocol(self, round_idx, contributions, central_noise, admit, dropped, tampered, round_seed):
        clients = contributions.clients
        if contributions.summed_noise is not None:  # refused by the policy: never drop the noise silently
            raise ValueError("privacy.dp.simulate_shares = 'summed' needs secure_aggregation.simulation = 'arithmetic'")
        shares = None if contributions.noise is None else _LazyVectors(clients, contributions.noise, self.covered)
        central = None if central_noise is None else central_noise[: self.covered].cpu().numpy()

        def intercept(cid: int, payload: bytes) -> bytes:
            return payload[:-1] + bytes([payload[-1] ^ 1]) if cid in tampered else payload

        result = self.session.run_round(
            round_idx,
            _LazyVectors(clients, contributions.vector, self.covered),
            noise_shares=shares,
            central_noise=central,
            drop_after_masking=dropped,
            admit=admit,
            intercept=intercept if tampered else None,
            round_seed=round_seed,
        )
        for cid, reason in result.rejected.items():
            log.warning("round %d: rejected client %d: %s", round_idx, cid, reason)
        total = torch.from_numpy(np.asarray(result.total, dtype=np.float64)).to(contributions.dtype)
        return result.contributors, total, result.clipped, len(result.rejected), SecAggCost(**result.cost)

    def _arithmetic(self, round_idx, contributions, central_noise, admit, dropped, tampered, round_seed):
        from fedrecgel_secure.privacy.secagg.arithmetic import contributors

        clients = contributions.clients
        ids = contributors(
            self.params,
            (int(c) for c in clients),
            dropped | tampered,
            min_clients=self.settings.min_clients,
            round_idx=round_idx,
            round_seed=round_seed,
            admit=admit,
        )
        position = {int(cid): pos for pos, cid in enumerate(clients)}
        part = slice(0, self.covered)
        total, clipped = grid_sum(
            self.grid, contributions, [position[c] for c in ids], central_noise, part, self.restrict
        )
        # The protocol counts the clipping of every client that encoded its upload, contributor or not.
        counted = set(ids)
        others = [position[int(c)] for c in clients if int(c) not in counted]
        clipped += grid_sum(self.grid, contributions, others, None, part)[1] if others else 0
        return ids, total, clipped, len(tampered), None


def make_summer(
    settings, n_clients: int, dim: int, n_item_values: int, seed: int, item_width: int = 1, norm_bound: float = 0.0
) -> Summer:
    """The summer a policy's ``[privacy.secure_aggregation]`` asks for; ``dim`` includes any extra coordinate;
    the item table, ``n_item_values`` in rows of ``item_width``, leads every vector; ``norm_bound``: what a checking
    scheme's uploads prove their norm within (:func:`.secagg.settings.norm_bound`). Unsealed: :class:`PlainSum`."""
    if not scheme_of(settings).sealed:
        return PlainSum(encoding(settings))
    covered = dim if settings.cover == "shared" else n_item_values
    return SecureSum(settings, n_clients, dim, covered, seed, (n_item_values // item_width, item_width), norm_bound)
