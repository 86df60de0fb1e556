"""DP in a deployment, party by party, over the in-process grid (:mod:`inprocess_grid`): the nodes draw the noise
shares, the key holder the central noise from a secret of its own, only the server spends privacy, and noise lost
with a node is accounted as the noise that reached the sum."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, run_records, seeded_dp
from helpers.inprocess_grid import deploy_inprocess as _deploy
from helpers.inprocess_grid import inprocess_policy as _policy


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


def test_the_key_holder_is_resident_and_answers_as_a_fresh_one_would(tmp_path, monkeypatch):
    # Like a shard's Node, the key holder's role and its central noise are made at its first message and kept by
    # its engine (deploy/node/handlers.py): its policy and pins read once, its DP mechanism calibrated once, its
    # BFV secret key loaded once a session. Everything it decides it reads from its record on disk at each request,
    # so the oracle is the same deployment with both made afresh for every message: the same releases, bit for bit.
    from fedrecgel_secure.deploy.node import handlers
    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode
    from fedrecgel_secure.privacy.secagg.bfv.keyholder import KeyHolder

    made, loaded = [], []
    for_node, load = KeyHolderNode.for_node.__func__, KeyHolder.load.__func__
    monkeypatch.setattr(KeyHolderNode, "for_node", classmethod(lambda cls, *a: made.append(1) or for_node(cls, *a)))
    monkeypatch.setattr(KeyHolder, "load", classmethod(lambda cls, *a, **k: loaded.append(1) or load(cls, *a, **k)))
    policy = _policy(tmp_path, BFV + seeded_dp("central"), rounds=3)
    _deploy(policy, tmp_path / "resident", key_holder=True)
    assert len(made) == 1 and len(loaded) <= 1  # one key holder; its keys made at start, so not even loaded

    resident = handlers._resident
    fresh = lambda key, policy, make: make() if key[0] == "key holder" else resident(key, policy, make)  # noqa: E731
    monkeypatch.setattr(handlers, "_resident", fresh)
    made.clear()
    (tmp_path / "oracle").mkdir()
    _deploy(_policy(tmp_path / "oracle", BFV + seeded_dp("central"), rounds=3), tmp_path / "fresh", key_holder=True)
    assert len(made) > 3  # the oracle really made one per message
    assert run_records(tmp_path / "resident") == run_records(tmp_path / "fresh")
    assert all("skipped" not in r for r in run_records(tmp_path / "resident"))
