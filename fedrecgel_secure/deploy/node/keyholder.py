"""What every scheme's key holder node shares: the public facts it reads (N and the catalogue's size, from the
shard manifest its node config names) and the central DP noise it adds to a round's release.

Under central DP a key holder draws the noise on its own node, from its own policy and its own randomness (a fresh
CSPRNG secret unless the policy asks for seeded noise), so that the server, which sees the release, never learns
it: BFV's adds it to the sum it decrypts (:mod:`.bfv_node`), DPF's to its share of the sum (:mod:`.dpf_node`).
What sizes it is the key holder's own: z and the accountant's N from its policy and manifest, the round it
releases, and C, which under adaptive clipping follows the noised clipped counts released before (BFV's key holder
reads them from its own record of what it decrypted; DPF's, which never sees a sum, is told them and holds the
users to the C it derives, :class:`~fedrecgel_secure.privacy.secagg.dpf.wire.Binding`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.keys import read_private_file, write_private_file

# (the release's round, the noised clipped count of each earlier release) -> the central noise, or None
NoiseFor = Callable[[int, Sequence[float]], "np.ndarray | None"]


def key_holder_catalogue(policy: Policy, catalogue: str | None):
    """The public shard manifest the key holder's node config names (``catalogue``), checked against its policy:
    the key holder holds no shard, and this is where it learns N and the catalogue's size."""
    from fedrecgel_secure.data.shards import load_catalogue
    from fedrecgel_secure.errors import BadInputError

    if catalogue is None:
        raise BadInputError(
            'the key holder\'s --node-config has no catalogue="…/manifest.json" (the public shard manifest):'
            " its central DP noise needs the number of users, and DPF's layout the number of items"
        )
    return load_catalogue(Path(catalogue), policy)


def key_holder_population(policy: Policy, catalogue: str | None) -> int:
    """N for the key holder's central noise: the number of users in the public shard manifest. The one place the
    key holder learns N."""
    return int(key_holder_catalogue(policy, catalogue).n_users)


class CentralNoise:
    """The key holder's central noise for vectors of ``dim`` values (the clipped bit and the reports included),
    drawn by :meth:`__call__`; the correlated rows of banded noise kept in ``rows_dir`` (:func:`banded_noise`)."""

    def __init__(self, policy: Policy, catalogue: str | None, dim: int, rows_dir: Path):
        self.policy, self.catalogue, self.full_dim, self.rows_dir = policy, catalogue, int(dim), Path(rows_dir)

    @cached_property
    def mechanism(self):
        """The policy's DP mechanism over the manifest's N (made at the first draw: a stage that draws nothing
        needs neither)."""
        from fedrecgel_secure.federation.build import make_dp_mechanism
        from fedrecgel_secure.federation.reports import scope_of

        population = key_holder_population(self.policy, self.catalogue)
        return make_dp_mechanism(self.policy, population, scope_of(self.policy, deployed=True))

    @property
    def dim(self) -> int:
        """The model's values; the extra coordinates (clipped bit, reports) have noise of their own."""
        return self.full_dim - self.mechanism.extra

    def clip_norm(self, counts: Sequence[float]) -> float:
        """C after the released ``counts`` (the policy's C without adaptive clipping), as the server moves it."""
        import torch

        # the server moves C by each release's count as its uploads' dtype holds it: the same numbers here
        held = torch.tensor(list(counts), dtype=torch.float64).to(getattr(torch, self.policy.model.dtype)).tolist()
        return self.mechanism.dp.clip_norm_after(held)

    def __call__(self, round_idx: int, counts: Sequence[float]) -> np.ndarray:
        """Round ``round_idx``'s noise (its attempt-0 draw: the key holder answers each round once), with the C
        that ``counts`` give; under banded correlation the update part is the round's row of C w = z."""
        mechanism, dim = self.mechanism, self.dim
        clip_norm = self.clip_norm(counts)
        noise = mechanism.central_noise(round_idx, dim, clip_norm, attempt=0).numpy()
        if mechanism.dp.bands is None:
            return noise

        # BandMF: from the key holder's own rows (a round it never answered: its attempt-0 draw, C constant)
        def draw(r: int) -> np.ndarray:
            return noise[:dim] if r == round_idx else mechanism.central_noise(r, dim, clip_norm, 0)[:dim].numpy()

        w = banded_noise(self.rows_dir, round_idx, draw, mechanism.dp.bands)
        return np.concatenate([w, noise[dim:]])


def banded_noise(rows_dir: Path, round_idx: int, draw, bands) -> np.ndarray:
    """Round ``round_idx``'s correlated update noise w_t = (z_t - sum_j c_j w_{t-j}) / c_0 (BandMF,
    :func:`fedrecgel_secure.privacy.dp.matrix.noise_row`), from ``draw(r)``, round r's fresh draw z_r.

    The rows live in the key holder's state directory (``noise-rows/R.npy``, 0600), written before the
    release: a round's row is its draw's whatever the request's outcome (the key holder draws each round
    once, attempt 0), so a round it never answered (skipped) gets the row it would have had, a restarted key
    holder reads the rows back, and the release sequence is that of the simulator's
    :class:`~fedrecgel_secure.federation.dp_aggregation.DPFedAvg`. Only the last ``len(bands) - 1`` rows are
    kept."""
    from fedrecgel_secure.privacy.dp.matrix import noise_row

    rows_dir = Path(rows_dir)
    rows_dir.mkdir(mode=0o700, exist_ok=True)
    memo: dict[int, np.ndarray] = {}

    def row(r: int) -> np.ndarray:
        if r not in memo:
            path = rows_dir / f"{r}.npy"
            if path.exists():
                memo[r] = np.frombuffer(read_private_file(path), dtype=np.float64).copy()
            else:
                earlier = [row(r - j) for j in range(len(bands) - 1, 0, -1) if r - j >= 1]
                memo[r] = np.asarray(noise_row(bands, np.asarray(draw(r), dtype=np.float64), earlier))
                write_private_file(path, memo[r].tobytes())
        return memo[r]

    out = row(round_idx)
    for old in rows_dir.glob("*.npy"):
        if int(old.stem) <= round_idx - len(bands) + 1:
            old.unlink()
    return out
