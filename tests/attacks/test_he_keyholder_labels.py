"""Attack: a malicious server makes up round labels to ask the BFV key holder one decryption per label
(issue 35, finding 4).

The key holder answers one request per round (test_he_keyholder_oracle.py), but
the round is the label the aggregate carries, and the server chooses which
rounds its nodes' users sign. Before the fix the labels were bounded by nothing
but monotonicity: 40 probe aggregates under labels 100-139 got 40 answers,
accepted exactly when the probe decrypted to 0, and a label of 10**9 was
accepted (and used every later round up). That is a decryption-validity oracle,
one query per label: the raw material of reaction attacks on BFV.

Now the deployment's key holder (:class:`KeyHolderNode`) answers only the rounds
of the run: labels 1..rounds of its own policy, each after the last one it
answered (its record on disk, across processes and sessions). Every request it
examines and refuses counts against a per-run limit in that record
(``privacy.secure_aggregation.bfv.max_refusals``); once it is reached, every
request is refused without decrypting anything, an honest one included.

Before the fix (this file run against the unfixed key holder, which takes no
bound): labels 3 and 10**9 of a 2-round run were both decrypted and released
(and 10**9 + 1 after them); 5 probes under fresh labels were each decrypted
(the probe of 0 accepted, 4 refused ``bad_ciphertext``) and the honest aggregate
of the next round was released after them; stale labels were refused
(``replay``), as they are now. The finding again: 40 probes under labels
100-139 got 40 decryptions, accepted exactly for the 6 probes of 0.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedrecgel_secure.privacy.secagg import RejectedPayload

ROUNDS, LIMIT = 10, 3
X = np.arange(20, dtype=np.float64).reshape(4, 5) / 10


@pytest.fixture
def world(tmp_path):
    from helpers.bfv_world import bfv_world

    return bfv_world(tmp_path)


@pytest.fixture
def decryptions(monkeypatch):
    """The rounds whose aggregate the key holder decrypted (and then checked the tags of), in order."""
    from fedrecgel_secure.privacy.secagg.bfv.keyholder import KeyHolder

    seen: list[int] = []
    check = KeyHolder._check_tags

    def spy(self, rows, round_idx, clients):
        seen.append(round_idx)
        return check(self, rows, round_idx, clients)

    monkeypatch.setattr(KeyHolder, "_check_tags", spy)
    return seen


def key_holder(tmp_path, setup, rounds=ROUNDS):
    """A fresh key-holder process on the state directory (every Flower message is one), bound to a run."""
    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode

    return KeyHolderNode(tmp_path / "kh", setup, rounds=rounds, max_refusals=LIMIT)


def honest(world, label, users=None) -> bytes:
    from helpers.bfv_world import aggregate

    _, nodes, directory, context, tag, _ = world
    return aggregate(context, directory, tag, nodes, label, X, users)


def probe(world, label, delta: int) -> bytes:
    """The honest aggregate of ``label`` with ``delta`` added to the first slot of its first ciphertext: accepted
    exactly when ``delta`` decrypts to 0 (the tags check every slot), so each answer is one bit about it."""
    from fedrecgel_secure.privacy.secagg.bfv.aggregator import EncryptedAggregate
    from fedrecgel_secure.privacy.secagg.bfv.wire import (
        _params_of,
        load_context,
        load_vectors,
        max_chunk_bytes,
        parse_aggregate,
        read_chunks,
    )

    blob = honest(world, label)
    _, dim, proofs, offset, count = parse_aggregate(blob)
    ctx = load_context(world[3], "public context")
    params = _params_of(ctx)
    vectors = load_vectors(ctx, params, read_chunks(blob, offset, count, max_chunk_bytes(params), None), None)
    vectors[0].add_([delta] + [0] * (params.slots - 1))
    return EncryptedAggregate(label, dim, proofs, vectors).serialize()


def refusal(holder, blob) -> str:
    with pytest.raises(RejectedPayload) as err:
        holder.decrypt(blob, None)
    assert not any(ch.isdigit() for ch in err.value.detail), err.value.detail  # no detail that varies
    return err.value.reason.value


def test_labels_beyond_the_runs_rounds_are_refused_and_decrypt_nothing(tmp_path, world, decryptions):
    setup = world[0]
    rounds = 2
    assert refusal(key_holder(tmp_path, setup, rounds), honest(world, rounds + 1)) == "wrong_round"
    assert refusal(key_holder(tmp_path, setup, rounds), honest(world, 10**9)) == "wrong_round"
    assert decryptions == []
    # a label outside the run uses no round up: the run's own rounds are answered
    assert np.allclose(key_holder(tmp_path, setup, rounds).decrypt(honest(world, 1), None), X.sum(0), atol=1e-9)
    assert refusal(key_holder(tmp_path, setup, rounds), honest(world, 0)) == "replay"  # at or below round 1
    # but each such label was examined and refused: the third reaches the limit, and round 2 gets nothing
    assert refusal(key_holder(tmp_path, setup, rounds), honest(world, rounds + 1)) == "wrong_round"
    assert refusal(key_holder(tmp_path, setup, rounds), honest(world, 2)) == "too_many_refusals"
    assert decryptions == [1]


def test_label_zero_is_not_a_round(tmp_path, world, decryptions):
    assert refusal(key_holder(tmp_path, world[0]), honest(world, 0)) == "wrong_round"
    assert decryptions == []


def test_probes_under_fresh_labels_get_at_most_the_limits_refusals(tmp_path, world, decryptions):
    setup = world[0]
    answers = []
    for label, delta in enumerate([1, 0, 2, 3, 4], start=1):  # the server's probes, one fresh label each
        try:
            key_holder(tmp_path, setup).decrypt(probe(world, label, delta), None)
            answers.append("accepted")
        except RejectedPayload as exc:
            answers.append(exc.reason.value)
    # the probe of 0 is answered (it is the honest sum), and LIMIT probes are examined and refused; then nothing
    assert answers == ["bad_ciphertext", "accepted", "bad_ciphertext", "bad_ciphertext", "too_many_refusals"]
    assert decryptions == [1, 2, 3, 4]
    # every further request is refused unexamined, an honest aggregate of a valid next round included, by a fresh
    # process and after a new session (a resumed server's) alike
    assert refusal(key_holder(tmp_path, setup), honest(world, 6)) == "too_many_refusals"
    _, nodes, directory, *_ = world
    key_holder(tmp_path, setup).start(
        directory, world[4], {n: nd.sealing_key() for n, nd in nodes.items()}, {n: nd.users for n, nd in nodes.items()}
    )
    assert refusal(key_holder(tmp_path, setup), honest(world, 7)) == "too_many_refusals"
    assert decryptions == [1, 2, 3, 4]


def test_labels_at_or_below_the_last_answered_are_refused_across_processes(tmp_path, world, decryptions):
    setup = world[0]
    first = key_holder(tmp_path, setup).decrypt(honest(world, 3), None)
    assert np.allclose(first, X.sum(0), atol=1e-9)
    for label, users in [(1, None), (2, None), (3, {1, 2, 3}), (3, {0, 1, 2}), (2, None)]:
        assert refusal(key_holder(tmp_path, setup), honest(world, label, users)) == "replay"
    assert decryptions == [3]
    # the same round and contributors again (a resumed server repeating the round its checkpoint missed) gets the
    # first release back, and is no refusal; nor are the stale labels, decided from the label and the record alone
    # (an honest server resumed from an older checkpoint sends them): the next rounds are still answered
    assert np.array_equal(key_holder(tmp_path, setup).decrypt(honest(world, 3), None), first)
    for label in (4, 5):
        assert np.allclose(key_holder(tmp_path, setup).decrypt(honest(world, label), None), X.sum(0), atol=1e-9)
    assert decryptions == [3, 4, 5]


def test_the_deployments_key_holder_takes_rounds_and_limit_from_its_own_policy(tmp_path, decryptions):
    """Through the ``keyholder`` handler: the bound and the limit are the key holder's policy's, not the request's."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedrecgel_secure.deploy.launch.layout import pin_identities
    from fedrecgel_secure.deploy.messages import ENTRY_OF
    from fedrecgel_secure.deploy.node.bfv_node import BFVNode
    from fedrecgel_secure.deploy.node.handlers import keyholder
    from fedrecgel_secure.deploy.node.pinned import sign_entry
    from fedrecgel_secure.deploy.schemes import setup_of
    from fedrecgel_secure.deploy.wire import from_record, to_record
    from fedrecgel_secure.policy import load_policy

    from helpers.bfv_world import aggregate
    from helpers.deploy import BFV, write_deploy_policy

    policy_file = write_deploy_policy(
        tmp_path, BFV + "[privacy.secure_aggregation.bfv]\nmax_refusals = 1\n", rounds=2, nodes=2
    )
    # the nodes' identity keys pinned in the policy, as deploy local does: the key holder takes the directory only
    # from entries the nodes signed under them (deploy/node/pinned.py)
    dirs = {str(n): tmp_path / f"node-{n}" for n in (0, 1)}
    policy_file.write_text(pin_identities(load_policy(policy_file), dirs).to_toml())
    policy = load_policy(policy_file)
    config = {"role": "keyholder", "state-dir": str(tmp_path / "kh"), "policy": str(policy_file)}
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0

    def ask(payload: dict) -> dict:
        msg = Message(to_record({**payload, "digest": policy.digest(), "dim": 5}), dst_node_id=7, message_type="query")
        msg.metadata.__dict__["_message_id"] = "m"
        context = Context(run_id=1, node_id=7, node_config=config, state=RecordDict(), run_config={})
        return from_record(keyholder(msg, context).content)

    setup = setup_of(policy, 5)
    users_of = {0: [0, 1], 1: [2, 3]}
    nodes = {n: BFVNode(tmp_path / f"node-{n}", users, setup) for n, users in users_of.items()}
    directory = {u: k for node in nodes.values() for u, k in node.keys.public_keys().items()}
    tag = b"t" * 16
    request = {"stage": "start", "session_tag": tag}
    for n in users_of:
        request[f"{ENTRY_OF}{n}"] = sign_entry(dirs[str(n)], n, policy.digest(), nodes[n].keys_reply())
    session = ask(request)
    for n, node in nodes.items():
        node.join(session["context"], tag, session[f"sealed:{n}"], directory)
    assert ask({"stage": "decrypt", "aggregate": aggregate(session["context"], directory, tag, nodes, 3, X)}) == {
        "refused": "wrong_round"
    }
    # max_refusals = 1 was that one: round 1, honest as it is, gets nothing
    assert ask({"stage": "decrypt", "aggregate": aggregate(session["context"], directory, tag, nodes, 1, X)}) == {
        "refused": "too_many_refusals"
    }
    assert decryptions == []
