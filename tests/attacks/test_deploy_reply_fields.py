"""Every field of every reply a node sends, against the rule of issue 35: a node sends the server its share of a
secure sum, and protocol messages that carry no function of its users' data; nothing else.

The attacker is the server, which reads every reply. Each setting runs the real ServerApp and ClientApp code over
the in-process grid for two rounds (so that an evaluation rides on a train stage), and every reply is taken
apart: its records, its payload's fields, the fields nested in a train reply's evaluation. Each field must be
declared in :data:`fedrecgel_secure.deploy.replies.FIELDS` and allowed for the policy (no upload vector under
secure aggregation, no loss or example count under secure aggregation or DP); a field someone adds without
declaring it makes the node refuse to send its reply, and this test fail.

Before the fix (c6d203b) the masking and BFV train replies carried ``bce`` and ``examples`` (the loss oracle of
tests/attacks/test_deploy_loss_oracle.py), and the masked stage's and BFV's replies ``clipped`` whenever the grid
clipped a value of the node's users' vectors: a count of a function of their data, outside the sum; nothing
declared what a reply may hold. What is still open is declared as such:
the evaluation's per-node HR/NDCG sums (threat model, "What the server can still do").
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, seeded_dp, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid

TIMING = {"imported", "done", "started", "loaded"}  # deploy.timing: wall-clock marks, the timing channel
SETTINGS = {
    "plaintext": "",
    "plaintext, central DP": seeded_dp("central"),
    "masking, distributed DP": MASKING + seeded_dp("distributed"),
    "bfv, central DP": BFV + seeded_dp("central"),
    "dpf, central DP": BFV.replace("bfv", "dpf") + seeded_dp("central"),
}


def every_reply(tmp_path, extra: str) -> tuple[object, list[tuple[str, object]]]:
    """Run the deployment of ``extra`` for two rounds; its policy, and (message type, reply) for every reply."""
    from fedrecgel_secure.deploy.schemes import deployed
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.policy import load_policy

    policy_file = write_deploy_policy(tmp_path, extra, 2, nodes=3, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    key_holder = out / "nodes" / "keyholder" if deployed(load_policy(policy_file)).scheme.key_holder else None
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, key_holder)
    kind: dict[str, str] = {}
    seen: list[tuple[str, object]] = []
    push, pull = grid.push_messages, grid.pull_messages

    def sent(messages):
        messages = list(messages)
        ids = push(messages)
        kind.update({mid: m.metadata.message_type for mid, m in zip(ids, messages)})
        return ids

    def pulled(ids):
        got = pull(ids)
        seen.extend((kind[m.metadata.reply_to_message_id], m) for m in got)
        return got

    grid.push_messages, grid.pull_messages = sent, pulled
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    return load_policy(policy_file), seen


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_reply_field_is_a_share_of_the_secure_sum_or_declared_data_free(tmp_path, setting):
    from fedrecgel_secure.deploy.replies import LOSS, VECTORS, undeclared
    from fedrecgel_secure.deploy.schemes import deployed
    from fedrecgel_secure.deploy.wire import from_record

    policy, seen = every_reply(tmp_path, SETTINGS[setting])
    by_type: dict[str, set[str]] = {}
    errors = [(t, m.error.reason) for t, m in seen if m.has_error()]
    assert errors == []  # a node refuses to send an undeclared field: that would show here
    for message_type, reply in seen:
        assert set(reply.content) <= {"payload", "timing"}, set(reply.content)
        assert set(reply.content.get("timing", {})) <= TIMING
        payload = from_record(reply.content)
        fields = set(payload) | {f"evaluation.{k}" for k in payload.get("evaluation", {})}
        by_type.setdefault(message_type, set()).update(fields)
        assert undeclared(policy, payload) == [], message_type
        assert undeclared(policy, payload.get("evaluation", {})) == [], message_type
    print(f"{setting}: " + "; ".join(f"{t}: {sorted(f)}" for t, f in sorted(by_type.items())))
    assert {"train", "query.hello"} <= set(by_type)
    everything = set().union(*by_type.values())
    sealed = deployed(policy).scheme.sealed
    if sealed:  # the uploads go only into the secure sum
        shares = {"group", "partial"} | {f for f in everything if f.startswith("dpf:")}  # masking, BFV, DPF
        assert not everything & set(VECTORS) and shares & everything
    if sealed or policy.privacy.dp.enabled:  # the loss oracle's channel is closed
        assert not everything & set(LOSS)
    else:
        assert set(LOSS) <= everything
    assert "clipped" not in everything


def test_a_field_that_is_not_declared_is_not_sent():
    from fedrecgel_secure.deploy.replies import check
    from fedrecgel_secure.policy import load_policy

    masking = load_policy(None, ["privacy.secure_aggregation.scheme=masking"])
    plain = load_policy(None, [])
    with pytest.raises(RuntimeError, match="not declared"):
        check(masking, {"clients": np.arange(3), "bce": 1.5})  # the loss, under secure aggregation
    with pytest.raises(RuntimeError, match="not declared"):
        check(plain, {"clients": np.arange(3), "per_user_loss": np.ones(3)})  # a field nobody declared
    assert set(check(plain, {"clients": np.arange(3), "bce": 1.5, "examples": 10})) == {"clients", "bce", "examples"}


def test_every_error_reply_carries_a_declared_reason_class_and_nothing_else(tmp_path):
    # Error replies and refusals are replies too (issue 45): the server's crafted messages make each node refuse
    # with a reason, which must be a declared class, never the exception's text (that named the user, and what
    # failed on its data). Round 1: node 0 gets a model of NaNs, node 1 another clip norm, node 2 another policy's
    # digest; round 2: node 0 a model one value short, node 1 a round label past the run.
    from fedrecgel_secure.deploy.replies import REASONS, Refused, declared_reason

    from helpers.malicious import TamperingGrid

    def tamper(group: str, payload: dict) -> bool:
        node = payload.get("sampled")
        if not group.startswith("round-") or node is None:
            return False
        shard = int(np.asarray(node)[0]) * 3 // 24  # contiguous shards of the tests' 24 users
        if group == "round-1":
            change = {0: ("shared", np.full_like(payload["shared"], np.nan)), 1: ("clip_norm", 9.0), 2: ("digest", "0")}
        else:
            change = {0: ("shared", payload["shared"][:-1]), 1: ("round", 10**6)}
        if shard in change:
            key, value = change[shard]
            payload[key] = value
        return shard in change

    from fedrecgel_secure.deploy.server.serverapp import run_server

    policy_file = write_deploy_policy(
        tmp_path, MASKING + seeded_dp("distributed"), 2, nodes=3, timeout=1.0, heartbeat=0.05
    )
    out = tmp_path / "deployed"
    grid = TamperingGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], tamper=tamper)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    reasons = {reason for _, reason in grid.refusals}
    assert all(declared_reason(r) for r in reasons), reasons
    assert {"NodeError('bad_model')", "NodeError('dp_settings')", "NodeError('wrong_policy')"} <= reasons
    assert not declared_reason("NodeError('upload of client 0 contains NaN or infinity')")
    with pytest.raises(ValueError, match="not a reason declared"):
        Refused("upload of client 0 contains NaN or infinity")
    # the relay's own classes are declared, and every reason the protocol's roles refuse with
    from fedrecgel_secure.privacy.secagg.errors import Reason

    assert {"failed", "unreachable"} <= set(REASONS) and {r.value for r in Reason} <= set(REASONS)
