"""Masking as node stages (deploy/node/masking_node.py, deploy/server/masking_driver.py), in one process but
across "processes": every stage builds a fresh :class:`MaskingNode` from its state directory, as a
new ``flwr-clientapp`` process would, and the payloads go through the Flower
record encoding. The released sum must equal the exact fixed-point sum that
:class:`SecAggSession` releases for the same inputs.
"""

from __future__ import annotations

import secrets
import stat

import numpy as np
import pytest

from fedrecgel_secure.deploy.messages import messages_of, reply
from fedrecgel_secure.deploy.node.masking_node import MaskingNode
from fedrecgel_secure.deploy.server.summer import reported_keys
from fedrecgel_secure.privacy.secagg import (
    RoundSkipped,
    ServerIdentity,
)

from helpers.masking_stages import ALL, SETUP, USERS_OF, Nodes, reference, start, vector

pytest.importorskip("flwr")
from fedrecgel_secure.deploy.wire import from_record, to_record


def test_two_rounds_release_the_sessions_exact_sum_and_keep_secrets_0600(tmp_path):
    nodes, driver = start(tmp_path, with_noise=True)
    for r in (1, 2):
        out = nodes.run_round(driver, r, ALL)
        assert out.contributors == ALL
        assert np.array_equal(out.total, reference(ALL, r, with_noise=True))
    for path in (tmp_path / "node-0" / "secagg").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_node_missing_the_masked_stage_is_recovered(tmp_path):
    nodes, driver = start(tmp_path)
    nodes.down["masked"] = {2}  # 9 of 12 left: the consistency check needs floor(2/3 * 12) + 1 = 9
    out = nodes.run_round(driver, 1, ALL)
    kept = [u for u in ALL if u not in USERS_OF[2]]
    assert out.contributors == kept
    assert np.array_equal(out.total, reference(kept, 1))


def test_more_dropouts_after_masking_than_the_check_allows_skip_the_round(tmp_path):
    nodes, driver = start(tmp_path)
    nodes.down["masked"] = {2, 3}
    with pytest.raises(RoundSkipped):  # below the share threshold or the consistency check
        nodes.run_round(driver, 1, ALL)


def test_a_node_missing_the_unmask_stage_still_releases_the_sum(tmp_path):
    nodes, driver = start(tmp_path)
    nodes.down["unmask"] = {0}
    out = nodes.run_round(driver, 1, ALL)
    assert out.contributors == ALL
    assert np.array_equal(out.total, reference(ALL, 1))


def test_too_few_left_skips_the_round_and_the_next_round_runs(tmp_path):
    nodes, driver = start(tmp_path)
    nodes.down["share"] = {1, 2, 3}  # 3 users left, min_clients 4
    with pytest.raises(RoundSkipped):
        nodes.run_round(driver, 1, ALL)
    nodes.down.clear()
    out = nodes.run_round(driver, 1, ALL)  # a skipped round changes no persistent state
    assert np.array_equal(out.total, reference(ALL, 1))


def test_a_directory_misstating_a_users_key_is_refused(tmp_path):
    nodes, _ = start(tmp_path)
    other = ServerIdentity.generate().public_bytes
    with pytest.raises(ValueError, match="misstates"):
        nodes.node(0).join(other, secrets.token_bytes(16), {u: other for u in ALL})


def test_a_node_reporting_foreign_users_is_refused(tmp_path):
    nodes = Nodes(tmp_path)
    keys = {n: {f"k:{u}": k for u, k in nodes.node(n).public_keys().items()} for n in USERS_OF}
    keys[0]["k:3"] = keys[1]["k:3"]
    with pytest.raises(RuntimeError, match="node 0"):
        reported_keys(keys, USERS_OF)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (
            ["privacy.secure_aggregation.scheme=bfv", "privacy.secure_aggregation.cover=item_embeddings"],
            "privacy.secure_aggregation.cover",
        ),
        (
            ["privacy.dp.enabled=true", "privacy.dp.mode=distributed", "privacy.dp.noise_multiplier=1.0"],
            "privacy.dp.mode",
        ),
        (
            ["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.cover=item_embeddings"],
            "privacy.secure_aggregation.cover",
        ),
        (
            ["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.dropout=0.1"],
            "privacy.secure_aggregation.dropout",
        ),
        (
            ["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.tampered=0.1"],
            "privacy.secure_aggregation.tampered",
        ),
    ],
)
def test_what_deployed_secure_aggregation_cannot_run_faithfully_is_refused_by_field(overrides, field):
    from fedrecgel_secure.deploy import check_deployable
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.policy import load_policy

    with pytest.raises(BadInputError, match=field.replace(".", r"\.")):
        check_deployable(load_policy(None, overrides))


@pytest.mark.parametrize("dp", ["off", "central", "distributed"])
def test_masking_with_or_without_dp_is_deployable(dp):
    from fedrecgel_secure.deploy import check_deployable
    from fedrecgel_secure.policy import load_policy

    on = [] if dp == "off" else ["privacy.dp.enabled=true", "privacy.dp.noise_multiplier=1.0", f"privacy.dp.mode={dp}"]
    check_deployable(load_policy(None, ["privacy.secure_aggregation.scheme=masking", *on]))


def test_adverts_that_came_with_the_train_message_start_the_round(tmp_path):
    nodes, driver = start(tmp_path)
    adverts = nodes.advertise(1, driver.begin(1), ALL)  # as the train replies carry them
    sent = []
    driver.exchange = lambda stage, p: sent.append(stage) or nodes.exchange(stage, p)
    out = driver.run_round(1, ALL, adverts=adverts)
    assert sent == ["share", "masked", "confirm", "unmask"]
    assert np.array_equal(out.total, reference(ALL, 1))


@pytest.mark.parametrize("stage", ["confirm", "unmask"])
def test_a_server_replaying_a_once_only_request_to_a_restarted_node_is_refused(tmp_path, stage):
    # Malicious server: each clientapp process is fresh, so "sign one survivor set" and "answer the unmask
    # request once" must survive on disk. It sends node 0 the same request a second time, to a new process.
    nodes, driver = start(tmp_path)
    second = {}

    def exchange(s, payloads):
        out = nodes.exchange(s, payloads)
        if s == stage:
            got = from_record(to_record(payloads[0]))
            second.update(nodes.node(0).step(stage, messages_of(got), nodes.inputs).__dict__)
        return out

    driver.exchange = exchange
    out = nodes.run_round(driver, 1, ALL)
    assert np.array_equal(out.total, reference(ALL, 1))  # the honest first answers released the sum
    assert second["replies"] == {}  # the replay got nothing: no second signature, no second set of shares
    # refused because the node remembers answering, not because it lost the attempt
    assert second["refused"] == dict.fromkeys(USERS_OF[0], "already_answered")


def test_the_train_stages_users_advertise_only_for_the_round_trained(tmp_path):
    # The node kept its inputs for the round it trained (the train payload's round); an announcement signed for
    # another round, riding on that train message, is refused by every user, so no attempt starts.
    from fedrecgel_secure.deploy.messages import request

    nodes, driver = start(tmp_path)
    announcement = driver.begin(2)
    got = from_record(to_record(request("advertise", dict.fromkeys(USERS_OF[0], b""), announcement)))
    result = nodes.node(0).step("advertise", messages_of(got), round_idx=1)
    assert result.replies == {} and result.refused == dict.fromkeys(USERS_OF[0], "wrong_round")
    assert all(nodes.node(0)._client(u).attempt_round is None for u in USERS_OF[0])


def test_a_users_kept_input_is_deleted_once_it_confirmed_the_round(tmp_path):
    # Node 0 masks the inputs its train stage kept; its users confirm in two messages (users 1 and 2, then user 0):
    # after the first, only user 0's row is left; after the second, the file is gone.
    nodes, driver = start(tmp_path)
    node = MaskingNode(tmp_path / "node-0", USERS_OF[0], SETUP)
    node.keep_inputs(1, np.asarray(USERS_OF[0]), np.stack([vector(u, 1) for u in USERS_OF[0]]), None)
    inputs = tmp_path / "node-0" / "secagg" / "inputs-1.npz"
    left = []

    def exchange(stage, payloads):
        out = {}
        for n, payload in payloads.items():
            messages = messages_of(from_record(to_record(payload)))
            nd = MaskingNode(tmp_path / f"node-{n}", USERS_OF[n], SETUP)
            kept = None if n == 0 else lambda r, us: {u: (vector(u, r), None) for u in us}  # node 0's own
            split = n == 0 and stage == "confirm"  # (a masked stage's reply holds one group: not split)
            parts = [{u: m for u, m in messages.items() if u != 0}, {0: messages[0]}] if split else [messages]
            replies = {}
            for part in parts:
                replies.update(reply(nd.step(stage, part, kept)))
                if n == 0 and stage == "confirm":
                    left.append(sorted(node.inputs(1, USERS_OF[0])) if inputs.exists() else None)
            out[n] = from_record(to_record(replies))
        return out

    driver.exchange = exchange
    out = nodes.run_round(driver, 1, ALL)
    assert out.contributors == ALL and np.array_equal(out.total, reference(ALL, 1))
    assert left == [[0], None]
