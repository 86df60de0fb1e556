"""The clients' roles in worker processes (ClientPool) against the same roles in one process (the oracle)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from fedrecgel_secure.errors import ProtocolStateError
from fedrecgel_secure.privacy.secagg import FixedPoint, make_session
from fedrecgel_secure.privacy.secagg.bfv.params import BFVParams
from fedrecgel_secure.privacy.secagg.clients import ClientSetup

DIM = 20_000  # big enough that vectors and uploads travel through shared memory
CLIENTS = list(range(1, 25))


def rounds(session, seed=0):
    """Two rounds with noise shares, central noise, silent clients and a tampered upload; what each released."""
    rng = np.random.default_rng(seed)
    out = []
    for r in (1, 2):
        uploads = {c: rng.normal(size=DIM) for c in CLIENTS}
        shares = {c: rng.normal(scale=0.1, size=DIM) for c in CLIENTS}
        uploads[CLIENTS[0]][:5] = 100.0  # clipped to the range: counted the same in both
        tampered = CLIENTS[2 + r]

        def flip(c, payload, tampered=tampered):
            return payload[:-1] + bytes([payload[-1] ^ 1]) if c == tampered else payload

        result = session.run_round(
            r,
            uploads,
            noise_shares=shares,
            central_noise=rng.normal(size=DIM),
            drop_after_masking={CLIENTS[5], CLIENTS[9 + r]},
            intercept=flip,
            round_seed=bytes([r]) * 16,
        )
        out.append(result)
    return out


@pytest.mark.parametrize("scheme", ["masking", "bfv"])
def test_a_pool_of_workers_releases_the_same_bits_as_one_process(scheme):
    kw = {"degree": 6} if scheme == "masking" else {}
    local = make_session(scheme, DIM, CLIENTS, min_clients=5, workers=1, **kw)
    pooled = make_session(scheme, DIM, CLIENTS, min_clients=5, workers=2, **kw)
    try:
        assert pooled.workers == 2 and pooled.clients == {}  # no client role, and no client key, lives here
        for a, b in zip(rounds(local), rounds(pooled), strict=True):
            assert np.array_equal(a.total, b.total)
            assert a.contributors == b.contributors
            assert a.rejected == b.rejected and len(a.rejected) == 1
            assert a.clipped == b.clipped == 5
            assert b.cost["upload_bytes"] > 8 * DIM and b.cost["client_seconds"] > 0
    finally:
        pooled.close()


def test_the_setup_a_worker_is_sent_keeps_only_its_own_clients_tag_keys():
    # ClientPool.start sends each worker setup.only_for(its clients)
    from fedrecgel_secure.privacy.secagg.bfv.session import BFVKeys

    keys = BFVKeys(b"context", {1: b"a", 2: b"b", 3: b"c"})
    setup = ClientSetup("bfv", 4, BFVParams(), FixedPoint(), b"t" * 16, 2, keys=keys)
    mine = setup.only_for([1, 3])
    assert mine.keys == BFVKeys(b"context", {1: b"a", 3: b"c"})
    assert mine.params == setup.params and setup.keys.tag_keys == {1: b"a", 2: b"b", 3: b"c"}


def _shm_names() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()} if Path("/dev/shm").is_dir() else set()


def test_close_stops_every_worker_and_leaves_no_shared_memory():
    before = _shm_names()
    session = make_session("masking", DIM, CLIENTS, min_clients=5, workers=2)
    procs = list(session.host._procs)
    session.run_round(1, {c: np.ones(DIM) for c in CLIENTS})
    session.close()
    assert all(not p.is_alive() for p in procs)
    assert _shm_names() <= before


def test_a_worker_that_dies_is_a_clear_error_not_a_hang():
    session = make_session("masking", DIM, CLIENTS, min_clients=5, workers=2)
    try:
        proc = session.host._procs[1]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=10)
        with pytest.raises(ProtocolStateError, match="worker 1 died"):
            session.run_round(1, {c: np.ones(DIM) for c in CLIENTS})
    finally:
        session.close()
