"""The two-server DPF scheme deployed: the server is the aggregator, the key-holder node the other server.

Over the in-process grid (:mod:`inprocess_grid`: the ServerApp's and the nodes' own code, without the SuperLink and
the processes, which tests/deploy/test_deploy.py has), a deployed run equals the simulator's, record for record and
bit for bit; the key holder releases one share per round, also across restarts and sessions, and holds the users to
the clip norm it sizes its noise with; the launcher and the plan start it as a SuperNode of its own.
"""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from fedrecgel_secure.deploy.launch.plan import SUPERNODE

pytest.importorskip("flwr")

from helpers.deploy import BANDED, BFV, run_records, seeded_dp, simulate, summed_per_node, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid, server_killed_before_checkpoint

DPF = BFV.replace("bfv", "dpf")
ADAPTIVE = """[privacy.dp.adaptive_clipping]
initial = 0.2
[privacy.secure_aggregation.dpf]
norm_check = false  # a bound that moves every round is not built: the policy refuses the two together
"""
SMALL_BUDGET = """[privacy.secure_aggregation.dpf]
budget = 3
"""


def _policy(tmp_path: Path, extra: str, rounds: int = 2) -> Path:
    return write_deploy_policy(tmp_path, DPF + extra, rounds, nodes=3, timeout=1.0, heartbeat=0.05)


def _grid(policy_file: Path, out: Path) -> InProcessGrid:
    return InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder")


def _same_model(out: Path, sim) -> bool:
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    model = load_checkpoint(out / "checkpoint.pt")["model"]
    return all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.parametrize(
    "privacy",
    [
        "dpf",
        "dpf + seeded central DP, adaptive",  # the key holder's C from the released counts, the users' C signed
        "dpf + seeded central DP, budget 3",  # users drop the rows past R = 3, on their node as in the simulator
    ],
)
def test_deployed_dpf_equals_the_simulator_exactly(tmp_path, caplog, privacy):
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.deploy.wire import from_record

    extra = seeded_dp("central") if "DP" in privacy else ""
    extra += (ADAPTIVE if "adaptive" in privacy else "") + (SMALL_BUDGET if "budget" in privacy else "")
    policy_file = _policy(tmp_path, extra)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = _grid(policy_file, out)
    train = []  # every train reply the server pulled
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: [train.append(m) or m for m in pull(ids)]
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    deployed = run_records(out)
    assert deployed == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert all(r["contributors"] > 0 for r in deployed) and _same_model(out, sim)
    if "adaptive" in privacy:  # the clip norm moved, and the key holder followed it
        assert len({r["clip_norm"] for r in deployed}) == 2
    assert ("rows past the budget R" in caplog.text) == ("budget" in privacy)  # the nodes' log, never a reply
    # each sampled user sent its own upload, and no vector left a node in the clear
    replies = [from_record(m.content) for m in train if m.metadata.group_id.startswith("round-")]
    for rep in replies:
        assert {f"dpf:{u}" for u in rep["clients"].tolist()} == {k for k in rep if k.startswith("dpf:")}
        assert not {"rows", "mlp", "row_item", "partial", "group"} & set(rep)
    # the key holder's sealing key lives on its node alone, 0600; it checked and released once a round
    key = out / "nodes" / "keyholder" / "dpf-seal.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(list(out.rglob("dpf-seal.key"))) == 1
    assert grid.groups.count("keyholder-start") == 1
    assert grid.groups.count("keyholder-check") == grid.groups.count("keyholder-release") == 2
    assert not (out / "nodes" / "keyholder" / "dpf-pending.npz").exists()  # released: nothing checked is left


def test_deployed_dpf_with_banded_noise_equals_the_simulator_and_the_key_holder_keeps_the_rows(tmp_path):
    # BandMF under DPF: the key holder draws each round's noise, adds its row of C w = z to its share and keeps the
    # last b - 1 rows on its own disk, as BFV's key holder does (tests/dp/test_dp_correlated.py)
    from fedrecgel_secure.deploy.server.serverapp import run_server

    policy_file = _policy(tmp_path, BANDED, rounds=4)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = _grid(policy_file, out)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert _same_model(out, sim) and all(r["contributors"] > 0 for r in run_records(out))
    rows = sorted((out / "nodes" / "keyholder" / "noise-rows").glob("*.npy"))
    assert [p.stem for p in rows] == ["4"] and stat.S_IMODE(rows[0].stat().st_mode) == 0o600


def _world(tmp_path: Path, dim: int = 30, rows: int = 6, width: int = 3):
    """Two client nodes of two users each and a key holder with a started session, as NodeDPFSum.start leaves them,
    and ``ask(r, users)``: a server's request of round ``r`` over ``users`` (their uploads, bound), with the
    aggregator that made it, a fresh one each time (a curious server forgets nothing it need not)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from fedrecgel_secure.deploy.node.dpf_node import DPFKeyHolderNode, DPFNode
    from fedrecgel_secure.deploy.schemes import Setup
    from fedrecgel_secure.privacy.secagg import FixedPoint, IdentityDirectory
    from fedrecgel_secure.privacy.secagg.dpf.params import DPFParams
    from fedrecgel_secure.privacy.secagg.dpf.servers import DPFAggregator
    from fedrecgel_secure.privacy.secagg.dpf.wire import Binding

    setup = Setup(dim, DPFParams(budget=2, rows=rows, width=width), FixedPoint(), min_clients=2)
    nodes = {n: DPFNode(tmp_path / f"node-{n}", users, setup) for n, users in {0: [0, 1], 1: [2, 3]}.items()}
    directory = {u: k for node in nodes.values() for u, k in node.public_keys().items()}
    tag, server_key = b"t" * 16, X25519PrivateKey.generate().private_bytes_raw()
    holder_key = DPFKeyHolderNode(tmp_path / "kh", setup).start(directory, tag)

    def aggregator() -> DPFAggregator:
        s = setup
        return DPFAggregator(
            IdentityDirectory(directory),
            params=s.params,
            dim=dim,
            min_clients=1,
            session_tag=tag,
            encoding=s.encoding,
            seal_key=server_key,
        )

    for node in nodes.values():
        node.join_session({"session_tag": tag, "seal_keys": aggregator().seal_key + holder_key}, directory)
    x = np.zeros((4, dim))
    x[:, :3] = np.arange(12).reshape(4, 3) / 8  # row 0 of the table, and one dense value a user
    x[:, -1] = np.arange(4) / 4

    def ask(round_idx: int, users=(0, 1, 2, 3), clip_norm: float | None = None):
        agg, binding = aggregator(), Binding(bytes(32), clip_norm)
        agg.begin_round(round_idx, binding)
        for node in nodes.values():
            for user, client in zip(node.users, node.clients(node.users)):
                if user in users:
                    agg.receive(client.upload(round_idx, x[user], binding=binding))
        return agg.finish(), agg

    return setup, directory, ask, x


def test_the_dpf_key_holder_releases_one_share_a_round_also_after_a_restart(tmp_path):
    # A curious server asks fresh key-holder processes (every message may be one) for a second release of round 1:
    # over other users (the difference of two sums is one user's upload) or the same again (fresh noise to average
    # away). The record of what it released is on the key holder's disk and survives restarts and new sessions.
    from fedrecgel_secure.deploy.node.dpf_node import PENDING, SEAL_KEY, DPFKeyHolderNode
    from fedrecgel_secure.privacy.secagg import RejectedPayload

    setup, directory, ask, x = _world(tmp_path)
    kh = tmp_path / "kh"

    def holder() -> DPFKeyHolderNode:  # a restarted key holder: nothing but its state directory
        return DPFKeyHolderNode(kh, setup, rounds=3)

    request, agg = ask(1)
    assert agg.settle(holder().check(request)) == [0, 1, 2, 3]
    assert stat.S_IMODE((kh / PENDING).stat().st_mode) == 0o600  # its checked share: secret
    checked = (kh / PENDING).read_bytes()
    assert np.allclose(setup.encoding.decode(agg.combine(holder().release(1))), x.sum(0), atol=1e-6)
    with pytest.raises(RejectedPayload, match="wrong_round"):  # nothing checked is left to release
        holder().release(1)
    (kh / PENDING).write_bytes(checked)  # as if it had died between its record and deleting the share
    with pytest.raises(RejectedPayload, match="replay"):
        holder().release(1)
    with pytest.raises(RejectedPayload, match="replay"):  # the same round without user 0: refused unexamined
        holder().check(ask(1, users=(1, 2, 3))[0])
    # a resumed server's new session: the same sealing key, the same record; a new round is served, once
    key = (kh / SEAL_KEY).read_bytes()
    holder().start(directory, b"u" * 16)
    assert (kh / SEAL_KEY).read_bytes() == key and stat.S_IMODE((kh / SEAL_KEY).stat().st_mode) == 0o600
    assert not (kh / PENDING).exists()  # what was checked in a session is not released in another
    with pytest.raises(RejectedPayload, match="replay"):
        holder().check(ask(1, users=(1, 2, 3))[0])
    holder().start(directory, b"t" * 16)  # back to the session the nodes joined
    with pytest.raises(RejectedPayload, match="wrong_round"):  # not a round of the run (3 rounds)
        holder().check(ask(4)[0])
    request, agg = ask(2, users=(1, 2, 3))
    agg.settle(holder().check(request))
    assert np.allclose(setup.encoding.decode(agg.combine(holder().release(2))), x[1:].sum(0), atol=1e-6)
    with pytest.raises(RejectedPayload, match="replay"):
        holder().check(ask(2)[0])


def test_the_dpf_key_holder_sizes_its_noise_for_the_clip_norm_the_users_signed(tmp_path):
    # Under central DP the key holder draws the noise with its own C. The users sign the C they clipped to (the
    # request's binding): a server that told them another C than the key holder derives (say a larger one, or
    # other released counts than the nodes got) gets no share; too few checked users get none either.
    from fedrecgel_secure.data.shards import MANIFEST, write_shards
    from fedrecgel_secure.deploy.node.dpf_node import DPFKeyHolderNode
    from fedrecgel_secure.deploy.node.keyholder import CentralNoise
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.privacy.secagg import RejectedPayload

    setup, _, ask, x = _world(tmp_path)
    policy = load_policy(_policy(tmp_path, seeded_dp("central")))  # C = 0.5
    write_shards(policy, tmp_path / "shards")
    noise = CentralNoise(policy, str(tmp_path / "shards" / MANIFEST), setup.dim, tmp_path / "kh" / "noise-rows")
    holder = DPFKeyHolderNode(tmp_path / "kh", setup)
    with pytest.raises(RejectedPayload, match="inconsistent"):
        holder.check(ask(1, clip_norm=1.0)[0], [], noise)
    request, agg = ask(1, clip_norm=0.5)
    agg.settle(holder.check(request, [], noise))
    released = setup.encoding.decode(agg.combine(holder.release(1, noise)))
    assert not np.allclose(released, x.sum(0), atol=1e-3)  # the noise the server cannot subtract
    assert np.allclose(released - noise(1, []), x.sum(0), atol=1e-4)  # seeded here: the key holder's own draw
    holder.check(ask(2, users=(3,), clip_norm=0.5)[0], [], noise)  # the server's own min_clients set to 1
    with pytest.raises(RejectedPayload, match="too_few_contributors"):
        holder.release(2, noise)


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_dpf_server_killed_after_a_release_resumes_to_the_uninterrupted_run(tmp_path):
    # The server dies after the key holder released round 2 and before its checkpoint of round 2. The key holder
    # releases no round twice (new uploads' shares would not add up with its old share anyway), so the resumed
    # server takes round 2's sum from its run directory; the run is the uninterrupted one.
    from fedrecgel_secure.deploy.server.serverapp import run_server

    policy_file = _policy(tmp_path, seeded_dp("central"), rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    with server_killed_before_checkpoint(2):
        run_server(_grid(policy_file, out), policy_file, out, resume=False, catalogue=_grid(policy_file, out).catalogue)
    grid = _grid(policy_file, out)
    run_server(grid, policy_file, out, resume=True, catalogue=grid.catalogue)
    assert grid.groups.count("keyholder-release") == 1  # round 3's; round 2 not asked again
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert _same_model(out, sim)


def test_a_dpf_policy_with_deployment_settings_validates_and_the_launcher_starts_the_key_holder(tmp_path):
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.deploy.schemes import deployed
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.policy import load_policy

    tls = ["deployment.tls.enabled=true", "deployment.tls.node_authentication=true"]
    policy = load_policy(_policy(tmp_path, seeded_dp("central")), tls)
    assert deployed(policy).scheme.key_holder
    line = Deployment(policy, tmp_path / "a").describe()
    assert "3 client SuperNodes and the DPF key holder's" in line and "one DPF key of each pair" in line
    supernodes = [s for s in plan(policy).splitlines() if s.startswith(SUPERNODE)]
    assert len(supernodes) == 4 and 'role="keyholder"' in supernodes[-1]
    assert "dpf-seal.key" in plan(policy) and "The DPF key holder" in plan(policy)
    with pytest.raises(BadInputError, match="mode = 'central'"):  # a dense noise share would touch every row
        load_policy(_policy(tmp_path, seeded_dp("distributed")))
