"""The batched grid sum against its oracle: every client encoding its own vector and noise share, one at a time.

:func:`noised_grid_sum` (a chunk of clients a time: one Gaussian pass over their shares, the touched rows added
sparsely) and the central path's :meth:`Uploads.grid_total` must release the same bits as the loop over
:func:`encode_contribution`, which is what each client does in the protocol (``tests/secagg/test_secagg_arithmetic.py``
holds the loop to the protocol). The oracle is the same contributions with their batched twins taken away.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrecgel_secure.federation import summers
from fedrecgel_secure.federation.summers import PlainSum, SecureSum
from fedrecgel_secure.policy import SecureAggregationPolicy
from fedrecgel_secure.privacy.dp.randomness import DPRandomness, _gaussian_on_host, _gaussian_torch
from fedrecgel_secure.privacy.secagg.settings import encoding

from helpers.noised import dense_twin, mechanism, row_uploads


def plain_path(contributions):
    """The oracle: no batched twins, so every sum goes client by client."""
    return dataclasses.replace(contributions, noises=None, add_grid_values=None, grid_total=None)


def assert_same(fast, plain):
    assert (fast.total is None) == (plain.total is None) and fast.skipped == plain.skipped
    if fast.total is not None:
        assert fast.total.dtype == plain.total.dtype
        assert torch.equal(fast.total.view(torch.int32), plain.total.view(torch.int32))  # bit for bit, signs of 0
    assert np.array_equal(fast.contributors, plain.contributors)
    assert (fast.clipped_values, fast.rejected, fast.dropped) == (plain.clipped_values, plain.rejected, plain.dropped)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(["distributed", "central"]),
    scheme=st.sampled_from(["none", "masking", "bfv"]),
    adaptive=st.booleans(),
    reports=st.sampled_from([0, 2]),
    dense=st.booleans(),
    clip_range=st.sampled_from([32.0, 0.25]),  # 0.25: noise and vectors leave the range, and are clipped
    dropout=st.sampled_from([0.0, 0.2]),
    cover=st.sampled_from(["shared", "item_embeddings"]),
    chunk=st.sampled_from([1, 7, 1 << 22]),  # clients of a chunk: one, some, all
    n_clients=st.integers(12, 30),
)
def test_the_batched_sum_releases_what_each_client_encoding_its_own_releases(
    seed, mode, scheme, adaptive, reports, dense, clip_range, dropout, cover, chunk, n_clients
):
    rng = np.random.default_rng(seed)
    n_items, width, mlp_dim = 9, 3, 5
    secagg = SecureAggregationPolicy(
        scheme=scheme,
        simulation="arithmetic",
        min_clients=5,
        allow_small_cohort=True,
        clip_range=clip_range,
        frac_bits=20,
        dropout=dropout if scheme != "none" else 0.0,
        tampered=0.1 if scheme != "none" else 0.0,
        cover=cover if scheme != "none" else "shared",
    )
    uploads = row_uploads(rng, n_clients, n_items, width, mlp_dim, scale=0.4)
    if dense:
        uploads = dense_twin(uploads)
    if reports:
        uploads.reports = torch.from_numpy(rng.uniform(-0.1, 1.1, (n_clients, reports)))
    dim = n_items * width + mlp_dim
    mech = mechanism(mode, adaptive, reports, secagg, seed)
    clients = np.sort(rng.choice(500, n_clients, replace=False)).astype(np.int64)
    contributions = mech.protect(3, clients, uploads, dim, torch.float32, participants=n_clients, clip_norm=0.5)
    central = None if mode == "distributed" else mech.central_noise(3, dim, 0.5)
    full = contributions.dim
    if scheme == "none":
        summer = PlainSum(encoding(secagg))
    else:
        summer = SecureSum(secagg, 500, full, full if cover == "shared" else n_items * width, seed, (n_items, width))
    original, summers.CHUNK_VALUES = summers.CHUNK_VALUES, chunk * full
    try:
        fast = summer(3, contributions, central_noise=central)
    finally:
        summers.CHUNK_VALUES = original
    assert_same(fast, summer(3, plain_path(contributions), central_noise=central))
    if mode == "distributed":
        assert contributions.batched()


def test_a_chunk_of_noise_rows_is_each_clients_own_draw():
    r = DPRandomness.from_seed(9)
    parties = np.array([40, 2, 17, 5])
    # 200,000 words a party: about a hundred take a second word from the tail stream each
    rows = r.normal_rows("update-share", 4, parties, 200_000, 0.7, attempt=2)
    for i, party in enumerate(parties):
        one = r.normal("update-share", 4, int(party), 200_000, 0.7, attempt=2)
        assert torch.equal(rows[i].view(torch.int64), one.view(torch.int64))
    assert r.normal_rows("update-share", 4, parties[:0], 10, 0.7).shape == (0, 10)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000), tail_share=st.floats(0, 1))
@settings(max_examples=60, deadline=None)
def test_the_host_gaussians_are_the_torch_operators_gaussians(seed, n, tail_share):
    # words whose low 63 bits are small take the tail path; tail_share of them are forced there
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    tails = rng.random(n) < tail_share
    words[tails] = (words[tails] & ~((1 << 63) - 1)) | rng.integers(0, 1 << 52, int(tails.sum()), dtype=np.int64)
    extra = torch.from_numpy(rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True))

    def tail_words(refine):
        return extra[: len(refine)]

    host = _gaussian_on_host(torch.from_numpy(words.copy()), tail_words)
    oracle = _gaussian_torch(torch.from_numpy(words.copy()), tail_words)
    assert torch.equal(host.view(torch.int64), oracle.view(torch.int64))
