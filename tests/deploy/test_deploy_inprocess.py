"""The deployment's server and node code end to end, in one process (:mod:`inprocess_grid`): fast checks that a
deployed run equals the simulator exactly, for what would take minutes with real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.bfv_world import aggregate, bfv_world, uploads

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, run_records, seeded_dp, simulate, summed_per_node, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid, server_killed_before_checkpoint

ADAPTIVE = """[privacy.dp.adaptive_clipping]
initial = 0.2
"""


def _policy(tmp_path: Path, extra: str, rounds: int = 2, nodes: int = 3) -> Path:
    return write_deploy_policy(tmp_path, extra, rounds, nodes, timeout=1.0, heartbeat=0.05)


def _deploy(policy_file: Path, out: Path, nodes: int = 3, down=None, key_holder: bool = False) -> InProcessGrid:
    from fedrecgel_secure.deploy.server.serverapp import run_server

    key_holder_dir = out / "nodes" / "keyholder" if key_holder else None
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(nodes)], down, key_holder_dir)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    return grid


@pytest.mark.parametrize("privacy", ["plaintext", "seeded central DP", "plaintext, the authors' data protocol"])
def test_a_deployment_without_secure_aggregation_equals_the_simulator_exactly(tmp_path, privacy):
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, seeded_dp("central") if "DP" in privacy else "")
    if "authors" in privacy:  # the nodes draw negatives outside the training set only, positives in blocks
        policy_file.write_text(policy_file.read_text().replace("[data]\n", '[data]\nprotocol = "authors"\n'))
    sim = simulate(policy_file, tmp_path / "sim")
    _deploy(policy_file, tmp_path / "deployed")
    assert run_records(tmp_path / "deployed") == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    model = load_checkpoint(tmp_path / "deployed" / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.parametrize(
    "privacy",
    [
        "masking + seeded central DP",
        "masking + seeded distributed DP",
        "masking + seeded distributed DP, adaptive clipping",
        "masking + seeded distributed DP, cyclic participation",
    ],
)
def test_dp_under_deployed_masking_equals_the_simulator_exactly(tmp_path, privacy):
    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    mode = "central" if "central" in privacy else "distributed"
    extra = MASKING + seeded_dp(mode) + ('sampler = "cyclic"\n' if "cyclic" in privacy else "")
    extra += ADAPTIVE if "adaptive" in privacy else ""
    policy_file = _policy(tmp_path, extra, rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    _deploy(policy_file, tmp_path / "deployed")
    deployed = run_records(tmp_path / "deployed")
    assert deployed == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert all(r["dp_noise"] == "seeded" and r["contributors"] > 0 for r in deployed)
    if "cyclic" in privacy:  # one epsilon against the release and the server, each user in one round of 3 (b = 2)
        assert all(r["epsilon"] == r["epsilon_server"] for r in deployed)
    if "adaptive" in privacy:  # the clip norm moved, and the nodes clipped to the server's announced norm
        assert len({r["clip_norm"] for r in deployed}) == 3
    model = load_checkpoint(tmp_path / "deployed" / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


def test_distributed_noise_shares_are_drawn_on_the_nodes_not_by_the_server(tmp_path, monkeypatch):
    # The server's DPFedAvg must never draw a client's share: count the draws by purpose in the server's process
    # while the nodes' draws go through Node.protect.
    from fedrecgel_secure.deploy.node.shard import Node
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness

    purposes: list[tuple[str, bool]] = []
    on_node = [False]
    original_normal, original_protect = DPRandomness.normal, Node.protect

    def normal(self, purpose, *args, **kwargs):
        purposes.append((purpose, on_node[0]))
        return original_normal(self, purpose, *args, **kwargs)

    def protect(self, *args):
        on_node[0] = True
        try:
            return original_protect(self, *args)
        finally:
            on_node[0] = False

    monkeypatch.setattr(DPRandomness, "normal", normal)
    monkeypatch.setattr(Node, "protect", protect)
    _deploy(_policy(tmp_path, MASKING + seeded_dp("distributed"), rounds=1), tmp_path / "deployed")
    shares = [on for purpose, on in purposes if purpose == "update-share"]
    assert shares and all(shares)
    assert not any(purpose == "update-noise" for purpose, _ in purposes)  # and no central noise either


def test_only_the_server_builds_a_privacy_accountant(tmp_path, monkeypatch):
    # The nodes (clipping, noise shares) and the key holder (central noise) spend no privacy: each of their calls
    # takes DP-FedAvg's clipping and noise alone, without the Opacus accountant (seconds to build, per message).
    from fedrecgel_secure.privacy.dp.resolution import ResolvedDP

    built = []
    make = ResolvedDP.make_accountant
    monkeypatch.setattr(ResolvedDP, "make_accountant", lambda self: built.append(1) or make(self))
    _deploy(_policy(tmp_path, BFV + seeded_dp("central"), rounds=2), tmp_path / "deployed", key_holder=True)
    assert len(built) == 1  # the server's


@pytest.mark.parametrize(
    "privacy",
    [
        "bfv",
        "bfv + seeded central DP",
        "bfv + seeded central DP, adaptive",  # the key holder replays the released counts for its C
        "bfv + seeded distributed DP, adaptive",
    ],
)
def test_deployed_bfv_equals_the_simulator_exactly(tmp_path, privacy):
    import stat

    import torch

    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    extra = BFV
    if "DP" in privacy:
        extra += seeded_dp("central" if "central" in privacy else "distributed")
    extra += ADAPTIVE if "adaptive" in privacy else ""
    policy_file = _policy(tmp_path, extra)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = _deploy(policy_file, out, key_holder=True)
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    assert all(r["contributors"] > 0 for r in run_records(out))
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
    # the secret key lives on the key holder's node alone, 0600; the nodes hold their tag keys, 0600
    key = out / "nodes" / "keyholder" / "keyholder.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not any(p.name == "keyholder.key" for p in (out / "nodes").rglob("*") if p.parent.name != "keyholder")
    for shard in range(3):
        assert stat.S_IMODE((out / "nodes" / str(shard) / "secagg" / "he.json").stat().st_mode) == 0o600
    # one decryption per round, and the key holder answered nothing else
    assert grid.groups.count("keyholder-decrypt") == 2 and grid.groups.count("keyholder-start") == 1


def test_a_key_holder_restarted_between_requests_releases_each_round_once(tmp_path):
    # A curious server asks a fresh key-holder process (every message is one) for round 1 again, hoping for a
    # second release: with other contributors it could difference the two sums down to one upload, and with
    # fresh central noise average the noise away. The record of what was released survives on disk.
    import numpy as np

    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode
    from fedrecgel_secure.privacy.secagg import RejectedPayload

    setup, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.arange(20, dtype=np.float64).reshape(4, 5) / 10
    first = KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 1, x), None)
    assert np.allclose(first, x.sum(0), atol=1e-9)
    # the same round without client 0: refused, so the two sums never give client 0's upload
    with pytest.raises(RejectedPayload, match="replay"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 1, x, {1, 2, 3}), None)
    # the same round and contributors with other values (a resumed server, fresh noise): the first release again
    again = aggregate(context, directory, tag, nodes, 1, x + 1.0)
    assert np.array_equal(KeyHolderNode(tmp_path / "kh", setup).decrypt(again, None), first)
    # a new session (a resumed server's) keeps the record
    KeyHolderNode(tmp_path / "kh", setup).start(
        directory, tag, {n: nd.sealing_key() for n, nd in nodes.items()}, {n: nd.users for n, nd in nodes.items()}
    )
    with pytest.raises(RejectedPayload, match="replay"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(aggregate(context, directory, tag, nodes, 1, x, {1, 2, 3}), None)


def test_the_server_cannot_open_the_tag_keys_it_relays(tmp_path):
    # The server relays each node's sealed tag keys; with everything it saw (the sealed bytes, the session tag,
    # the nodes' public sealing keys) and a key of its own it cannot open them, and a node given another node's
    # bundle cannot either.
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from fedrecgel_secure.deploy.node.bfv_node import _INFO, _suite

    _, nodes, directory, context, tag, sealed = bfv_world(tmp_path)
    with pytest.raises(InvalidTag):
        _suite().decrypt(sealed[0], X25519PrivateKey.generate(), info=_INFO + tag)
    with pytest.raises(InvalidTag):
        nodes[1].join(context, tag, sealed[0], directory)


def test_under_bfv_the_train_reply_carries_a_ciphertext_sum_and_no_vector(tmp_path):
    from fedrecgel_secure.deploy.wire import from_record

    out = tmp_path / "deployed"
    grid = InProcessGrid(
        _policy(tmp_path, BFV, rounds=1), [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder"
    )
    seen = []
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: [seen.append(m) or m for m in pull(ids)]
    from fedrecgel_secure.deploy.server.serverapp import run_server

    run_server(grid, tmp_path / "policy.toml", out, resume=False, catalogue=grid.catalogue)
    train = [from_record(m.content) for m in seen if m.metadata.group_id == "round-1"]
    assert train and all(not {"rows", "mlp", "row_item"} & set(rep) for rep in train)
    assert all("partial" in rep for rep in train)  # one encrypted sum of its users' uploads per node


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_bfv_server_killed_after_a_release_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    # The server dies after the key holder released round 2 and before its checkpoint of round 2: the resumed
    # server repeats round 2 with the same contributors and gets the same release, so the run is unchanged.
    import torch

    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, BFV + seeded_dp("central"), rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder")
    with server_killed_before_checkpoint(2):
        run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    assert load_checkpoint(out / "checkpoint.pt")["round"] == 1
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, out / "nodes" / "keyholder")
    run_server(grid, policy_file, out, resume=True, catalogue=grid.catalogue)
    assert grid.groups.count("keyholder-decrypt") == 2  # rounds 2 (the repeat) and 3
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())


@pytest.mark.parametrize(("scheme", "stage"), [("masking", "secagg-masked"), ("bfv", "round-1")])
def test_noise_shares_lost_with_a_node_are_accounted_as_the_noise_that_reached_the_sum(tmp_path, scheme, stage):
    # Distributed DP: node 1 goes silent (after key sharing under masking, every round; in round 1's train stage
    # under BFV). Its users' noise shares never reach the sum, so a round is charged at the noise that did:
    # z * sqrt(contributors / sampled) with z = 1, and epsilon is computed from that.
    import math

    from fedrecgel_secure.privacy.dp.accounting import PrivacyAccountant

    # Under BFV the users' proofs are bound to the sample their shares were sized for, and the key holder decrypts
    # only an aggregate of all of them (tests/attacks/test_deploy_bfv_binding.py): a round a node missed is
    # skipped instead, and charged at the planned z (the skip itself depends on the sample).
    extra = (MASKING if scheme == "masking" else BFV) + seeded_dp("distributed")
    out = tmp_path / "deployed"
    _deploy(_policy(tmp_path, extra, rounds=2), out, down={1: (stage,)}, key_holder=scheme == "bfv")
    records = run_records(out)
    if scheme == "bfv":
        assert records[0]["contributors"] == 0 and "skipped" in records[0]
    else:
        assert 0 < records[0]["contributors"] < records[0]["sampled"]
    accountant = PrivacyAccountant("pld", 0.5, 1.0, 1e-5)  # the policy's accountant (the default), q, z and delta
    for r in records:
        reached = math.sqrt(r["contributors"] / r["sampled"]) if r["contributors"] else 1.0
        assert r["noise_multiplier"] == pytest.approx(reached)
        accountant.step(r["noise_multiplier"])
        assert r["epsilon"] == pytest.approx(accountant.epsilon())


@pytest.mark.parametrize("message_type", ["train", "query.evaluate", "query.secagg"])
def test_the_key_holder_answers_only_its_own_stages(tmp_path, message_type):
    from flwr.app import Message

    from fedrecgel_secure.deploy.wire import to_record

    out = tmp_path / "deployed"
    grid = InProcessGrid(_policy(tmp_path, BFV), [out / "nodes" / "0"], None, out / "nodes" / "keyholder")
    key_holder = grid.get_node_ids()[-1]
    payload = {"round": 1, "stage": "keys", "dim": 5, "digest": "d"}
    msg = Message(to_record(payload), dst_node_id=key_holder, message_type=message_type)
    (mid,) = grid.push_messages([msg])
    (reply,) = grid.pull_messages([mid])
    # the reason class alone: the node's log has the sentence
    assert reply.has_error() and reply.error.reason == "NodeError('wrong_role')"


def test_the_start_line_says_what_the_server_sees_and_marks_seeded_noise(tmp_path):
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.policy import load_policy

    bfv = load_policy(_policy(tmp_path, BFV + seeded_dp("distributed")))
    line = Deployment(bfv, tmp_path / "a").describe()
    assert "3 client SuperNodes and the BFV key holder's" in line and "ciphertexts and the sum only" in line
    assert "no TLS" in line and "SEEDED noise" in line and "ε against the server above the release's" in line
    cyclic = load_policy(_policy(tmp_path, MASKING + seeded_dp("distributed") + 'sampler = "cyclic"\n'))
    assert "one ε against the release and the server" in Deployment(cyclic, tmp_path / "c").describe()
    plain = Deployment(load_policy(_policy(tmp_path, "")), tmp_path / "b").describe()
    assert "the server sees every upload" in plain and "key holder" not in plain and "DP" not in plain


def test_the_plan_puts_the_key_holder_on_its_own_node_with_its_own_registered_key(tmp_path):
    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(
        _policy(tmp_path, BFV), ["deployment.tls.enabled=true", "deployment.tls.node_authentication=true"]
    )
    text = plan(policy)
    supernodes = [line for line in text.splitlines() if line.startswith("flower-supernode")]
    assert len(supernodes) == 4 and 'role="keyholder" state-dir="nodes/keyholder"' in supernodes[-1]
    assert "--auth-supernode-private-key node-keyholder.key" in supernodes[-1]
    assert "flwr supernode register node-keyholder.key.pub deploy --name node-keyholder" in text
    assert "shard=" not in supernodes[-1] and all("role=" not in line for line in supernodes[:-1])


def test_under_bfv_the_central_noise_comes_from_a_secret_the_server_does_not_hold(tmp_path, monkeypatch):
    # Secure noise, central DP: the key holder draws the noise it adds after decryption from a CSPRNG secret of
    # its own, so the server, which knows the exact sum's release only, cannot subtract the noise.
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer
    from fedrecgel_secure.federation import build as build_module

    made = []  # (what was drawn, the randomness secret it was drawn from)
    make = build_module.make_dp_mechanism

    def recording(policy, n_users, *args, **kwargs):
        mechanism = make(policy, n_users, *args, **kwargs)
        normal = mechanism.randomness.normal

        def drawn(purpose, *args, **kwargs):
            made.append((purpose, mechanism.randomness.state_dict()["secret"]))
            return normal(purpose, *args, **kwargs)

        mechanism.randomness.normal = drawn
        return mechanism

    monkeypatch.setattr(build_module, "make_dp_mechanism", recording)
    servers = []
    init = RemoteTrainer.__init__
    monkeypatch.setattr(RemoteTrainer, "__init__", lambda self, *a: init(self, *a) or servers.append(self))
    secure_dp = seeded_dp("central").replace('noise = "seeded"', 'noise = "secure"')
    _deploy(_policy(tmp_path, BFV + secure_dp, rounds=1), tmp_path / "deployed", key_holder=True)
    server_secret = servers[0].aggregation.randomness.state_dict()["secret"]
    key_holder_draws = [secret for purpose, secret in made if purpose == "update-noise" and secret != server_secret]
    assert len(key_holder_draws) == 1  # round 1's noise, drawn by the key holder from its own secret
    assert run_records(tmp_path / "deployed")[0]["dp_noise"] == "secure"


def test_a_partial_sum_that_is_not_its_named_users_uploads_is_refused_by_the_key_holder(tmp_path):
    # A curious server trying to isolate user 1 puts node 0's proofs for users 0 and 1 on user 0's ciphertext
    # alone, adds node 1's honest sum and asks the key holder. Its own aggregator refuses such a partial (the
    # proofs signed another ciphertext), but it need not use it: the signatures check out at the key holder, the
    # tags do not. Nothing is released and the round is used up. The honest sums decrypt to the exact total.
    import shutil

    import numpy as np

    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode
    from fedrecgel_secure.privacy.secagg import IdentityDirectory, RejectedPayload
    from fedrecgel_secure.privacy.secagg.bfv.aggregator import EncryptedAggregate, HEAggregator
    from fedrecgel_secure.privacy.secagg.bfv.wire import (
        load_vectors,
        max_chunk_bytes,
        parse_aggregate,
        read_chunks,
    )

    setup, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.arange(20, dtype=np.float64).reshape(4, 5) / 10
    honest = [nodes[n].partial_sum(1, np.asarray(nodes[n].users), x[nodes[n].users], None)[0] for n in (0, 1)]

    def aggregator(min_clients=2):
        agg = HEAggregator(context, IdentityDirectory(directory), 5, min_clients=min_clients, session_tag=tag)
        agg.begin_round(1)
        return agg

    def vectors(agg, blob):
        _, _, _, offset, count = parse_aggregate(blob)
        return load_vectors(
            agg.context, agg.params, read_chunks(blob, offset, count, max_chunk_bytes(agg.params), None), None
        )

    alone = aggregator(1)
    alone.receive(uploads(nodes, 1, x)[0])
    user_0 = vectors(alone, alone.finish().serialize())
    forged = EncryptedAggregate(1, 5, parse_aggregate(honest[0])[2], user_0).serialize()  # proofs of users 0, 1
    with pytest.raises(RejectedPayload) as refused:
        aggregator().receive_partial(forged)
    assert refused.value.reason == "bad_signature"
    server = aggregator()
    node_1 = vectors(server, honest[1])
    for mine, theirs in zip(user_0, node_1):
        mine.add_(theirs)
    proofs = parse_aggregate(honest[0])[2] + parse_aggregate(honest[1])[2]
    shutil.copytree(tmp_path / "kh", tmp_path / "kh-unasked")  # the key holder as it was before the request
    with pytest.raises(RejectedPayload, match="bad_ciphertext"):
        KeyHolderNode(tmp_path / "kh", setup).decrypt(EncryptedAggregate(1, 5, proofs, user_0).serialize(), None)
    server = aggregator()
    for partial in honest:
        server.receive_partial(partial)
    honest_total = server.finish().serialize()
    with pytest.raises(RejectedPayload, match="replay"):  # the refused request used the round up
        KeyHolderNode(tmp_path / "kh", setup).decrypt(honest_total, None)
    total = KeyHolderNode(tmp_path / "kh-unasked", setup).decrypt(honest_total, None)
    assert np.allclose(total, x.sum(0), atol=1e-9)


def test_the_server_checks_each_proof_of_a_partial_sum(tmp_path):
    import numpy as np

    from fedrecgel_secure.privacy.secagg import IdentityDirectory, RejectedPayload
    from fedrecgel_secure.privacy.secagg.bfv.aggregator import HEAggregator

    _, nodes, directory, context, tag, _ = bfv_world(tmp_path)
    x = np.ones((4, 5))
    partial = nodes[0].partial_sum(1, np.asarray(nodes[0].users), x[:2], None)[0]

    def aggregator(round_idx=1):
        agg = HEAggregator(context, IdentityDirectory(directory), 5, min_clients=2, session_tag=tag)
        agg.begin_round(round_idx)
        return agg

    with pytest.raises(RejectedPayload) as wrong_round:
        aggregator(2).receive_partial(partial)
    assert wrong_round.value.reason == "wrong_round"
    twice = aggregator()
    twice.receive_partial(partial)
    with pytest.raises(RejectedPayload) as duplicate:
        twice.receive_partial(partial)
    assert duplicate.value.reason == "duplicate_client"
    with pytest.raises(RejectedPayload) as stranger:
        aggregator().receive_partial(partial, cohort={0, 2, 3})
    assert stranger.value.reason == "not_in_cohort"
    forged = bytearray(partial)
    forged[30] ^= 1  # inside the first proof (after the 20-byte header and the client id): its digest
    with pytest.raises(RejectedPayload) as bad:
        aggregator().receive_partial(bytes(forged))
    assert bad.value.reason == "bad_signature"


def test_every_stage_is_journaled_with_its_time_and_who_answered(tmp_path):
    out = tmp_path / "deployed"
    _deploy(_policy(tmp_path, MASKING, rounds=1), out, down={2: ("secagg-unmask",)})
    lines = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()]
    stages = [line["stage"] for line in lines]
    assert stages == [
        "hello",
        "secagg-keys",
        "secagg-join",
        "round-1",
        "secagg-share",
        "secagg-masked",
        "secagg-confirm",
        "secagg-unmask",
    ]  # fmt: skip  (no evaluate stage: under masking the metrics ride inside a later round's sum, and there is none)
    unmask = lines[stages.index("secagg-unmask")]
    assert unmask["answered"] == unmask["sent"] - 1 and unmask["seconds"] >= 1.0  # node 2 waited out the timeout
    assert all(line["seconds"] >= 0 for line in lines)
    # each answered stage split into its parts by the nodes' timestamps (deploy/timing.py)
    from fedrecgel_secure.deploy.timing import PARTS

    train = lines[stages.index("round-1")]["parts"]
    assert set(train) == set(PARTS) and train["work"] > 0 and train["imports"] >= 0
    assert all(set(line["parts"]) == set(PARTS) for line in lines if line["answered"])


@pytest.mark.slow  # end to end: left out of the contributors' fast path (-m 'not slow'), run in CI
def test_a_masking_server_killed_after_a_release_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    # The server dies after round 2's sum was released and before its checkpoint of round 2. The users refuse a
    # second attempt of round 2 (they confirmed it), so the resumed server takes round 2's sum from its run
    # directory (releases/) instead of running the protocol again: the run is the uninterrupted one.
    import stat

    import torch

    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    policy_file = _policy(tmp_path, MASKING + seeded_dp("central"), rounds=3)
    sim = simulate(policy_file, tmp_path / "sim")
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    with server_killed_before_checkpoint(2):
        run_server(grid, policy_file, out, False, grid.catalogue)
    assert load_checkpoint(out / "checkpoint.pt")["round"] == 1
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    run_server(grid, policy_file, out, resume=True, catalogue=grid.catalogue)
    assert grid.groups.count("secagg-unmask") == 3  # round 3's, one message per node; round 2 not run again
    assert run_records(out) == summed_per_node(run_records(tmp_path / "sim"), policy_file)
    model = load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(model[k], v) for k, v in sim.model.state_dict().items())
    assert stat.S_IMODE((out / "releases" / "round-3.npz").stat().st_mode) == 0o600
