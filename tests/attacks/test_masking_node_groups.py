"""Attacks on the deployed masked stage, where each node sends ONE group: its users' masked inputs summed mod 2^64,
with every listed user's seal over (attempt context, round, the exact list, the sum).

The real nodes (:class:`MaskingNode`, a fresh one per message, payloads through Flower records) and the real
server side (:class:`MaskingDriver` over :class:`MaskingAggregator`) run; the attacker is the server, or a node,
or whoever replays what it recorded:

1. the difference attack: a server asks one node twice in one attempt, once without the victim, to subtract
   the two groups down to the victim's masked input (and to have its other users mask a second time);
2. a node's group that lists a user of another node, one whose seal is missing, or one whose seal was made over
   another list;
3. a group recorded in one attempt and replayed into another attempt of the round, or into the next round.

Each must leave the server without the extra sum or make it refuse the group whole; the round then completes
with dropout recovery (or the honest sum), never with a sum the listed users did not seal.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedrecgel_secure.deploy.messages import messages_of, reply
from fedrecgel_secure.deploy.wire import from_record, to_record
from fedrecgel_secure.privacy.secagg import RoundSkipped
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload
from fedrecgel_secure.privacy.secagg.identity import SIGNATURE_BYTES
from fedrecgel_secure.privacy.secagg.masking.wire import decode_group, encode_group, group_statement

from helpers.masking_stages import ALL, DIM, SETUP, USERS_OF, reference, start

VICTIM = 1  # on node 0 with users 0 and 2


def ring_sum(group: bytes, round_idx: int) -> np.ndarray:
    return decode_group(group, round_idx, DIM)[2].astype(np.uint64)


def test_a_server_asking_a_node_twice_gets_no_second_group_to_subtract(tmp_path):
    # The server sends node 0 the masked stage for all its users, then again for all but the victim: the second
    # group's sum, subtracted from the first, would be the victim's masked input, and each other user would have
    # masked a second time. Every user masks and seals once per attempt, so the second request gets nothing.
    nodes, driver = start(tmp_path)
    second: dict = {}

    def exchange(stage, payloads):
        out = nodes.exchange(stage, payloads)
        if stage == "masked":
            again = messages_of(from_record(to_record(payloads[0])))
            again.pop(VICTIM)
            second.update(reply(nodes.node(0).step("masked", again, nodes.inputs)))
        return out

    driver.exchange = exchange
    with pytest.raises(RoundSkipped):  # the refusing users abort the attempt: the server that asked loses the round
        nodes.run_round(driver, 1, ALL)
    assert "group" not in second  # no second group: nothing to subtract
    assert second == {f"x:{u}": "already_answered" for u in USERS_OF[0] if u != VICTIM}


def test_a_user_refuses_to_seal_a_second_group_or_a_group_that_leaves_it_out(tmp_path):
    # The client side of the rule above, directly: once sealed, never again in the attempt, whatever the list.
    nodes, driver = start(tmp_path)
    checked = []

    def exchange(stage, payloads):
        if stage == "masked":
            node = nodes.node(0)
            clients = {u: node._client(u) for u in USERS_OF[0]}
            inbox = messages_of(from_record(to_record(payloads[0])))
            ys = {u: c.mask(inbox[u], np.zeros(DIM)) for u, c in clients.items()}
            round_idx = clients[0].attempt_round
            others = group_statement(round_idx, [0, 2], ys[0] + ys[2])
            with pytest.raises(RejectedPayload) as left_out:
                clients[VICTIM].seal_group(others)
            both = group_statement(round_idx, [0, 2], ys[0] + ys[2])
            clients[0].seal_group(both)
            with pytest.raises(RejectedPayload) as twice:
                clients[0].seal_group(group_statement(round_idx, [0], ys[0]))
            checked.extend([left_out.value.reason, twice.value.reason])
            raise RoundSkipped("attack_over", "the attacker stops here")
        return nodes.exchange(stage, payloads)

    driver.exchange = exchange
    with pytest.raises(RoundSkipped):
        nodes.run_round(driver, 1, ALL)
    assert checked == [Reason.NOT_IN_COHORT, Reason.ALREADY_ANSWERED]


def _forging_node(nodes, forge):
    """The exchange with node 0's masked-stage reply replaced by ``forge(its honest group) -> group``."""

    def exchange(stage, payloads):
        out = nodes.exchange(stage, payloads)
        if stage == "masked" and 0 in out:
            out[0] = {**out[0], "group": forge(out[0]["group"])}
        return out

    return exchange


def _relist(group: bytes, round_idx: int, users: list[int], signatures: list[bytes]) -> bytes:
    """Node 0's sum under another list of users, with the given seals."""
    return encode_group(group_statement(round_idx, users, ring_sum(group, round_idx)), signatures)


@pytest.mark.parametrize("how", ["another_nodes_user", "seal_missing", "seal_over_another_list"])
def test_a_group_whose_listed_users_did_not_all_seal_it_is_refused_whole(tmp_path, how):
    # Node 0 is malicious. It lists user 3 (node 1's) in its group, to have the server count user 3 as sent (and
    # refuse node 1's honest group as a duplicate), with node 0's own seal in user 3's place; or it drops a
    # listed user's seal; or it sends a list other than the one its users sealed, with their seals.
    nodes, driver = start(tmp_path)

    def forge(group: bytes) -> bytes:
        users, _, _, seals = decode_group(group, 1, DIM)
        if how == "another_nodes_user":
            return _relist(group, 1, [*users, 3], [*seals, seals[0]])
        if how == "seal_missing":
            return group[:-SIGNATURE_BYTES]
        return _relist(group, 1, users[:-1], seals[:-1])  # the first two users' seals, over all three

    driver.exchange = _forging_node(nodes, forge)
    out = nodes.run_round(driver, 1, ALL)
    kept = [u for u in ALL if u not in USERS_OF[0]]  # node 0's users are dropped; the rest is recovered exactly
    assert out.contributors == kept and np.array_equal(out.total, reference(kept, 1))


def test_the_aggregator_alone_refuses_a_group_naming_a_user_it_cannot_verify(tmp_path):
    # The same forgery without the server's record of who is hosted where: the seals decide.
    nodes, driver = start(tmp_path)
    reasons = []

    def exchange(stage, payloads):
        out = nodes.exchange(stage, payloads)
        if stage == "masked":
            users, _, _, seals = decode_group(out[0]["group"], 1, DIM)
            forged = _relist(out[0]["group"], 1, [*users, 3], [*seals, seals[0]])
            with pytest.raises(RejectedPayload) as err:
                driver.agg.receive_group(forged)
            reasons.append(err.value.reason)
        return out

    driver.exchange = exchange
    out = nodes.run_round(driver, 1, ALL)
    assert reasons == [Reason.BAD_SIGNATURE]
    assert out.contributors == ALL and np.array_equal(out.total, reference(ALL, 1))


@pytest.mark.parametrize("into", ["another_attempt", "the_next_round"])
def test_a_group_replayed_from_another_attempt_is_refused(tmp_path, into):
    # A recorded group of round 1's first attempt (skipped: too few confirmations) is replayed in place of node 0's
    # group in round 1's second attempt, or in round 2: its seals are over the first attempt's context and round.
    nodes, driver = start(tmp_path)
    recorded = {}

    def first_attempt(stage, payloads):
        if stage == "confirm":
            return {}  # nobody confirms: the attempt is skipped after the masked stage
        out = nodes.exchange(stage, payloads)
        if stage == "masked":
            recorded["group"] = out[0]["group"]
        return out

    driver.exchange = first_attempt
    with pytest.raises(RoundSkipped):
        nodes.run_round(driver, 1, ALL)
    round_idx = 1 if into == "another_attempt" else 2
    driver.exchange = _forging_node(nodes, lambda honest: recorded["group"])
    out = nodes.run_round(driver, round_idx, ALL)
    kept = [u for u in ALL if u not in USERS_OF[0]]
    assert out.contributors == kept and np.array_equal(out.total, reference(kept, round_idx))


def test_a_group_counts_each_user_once_and_equals_the_per_user_sum(tmp_path):
    # Control for the attacks above: the honest groups release exactly what the per-user uploads release, and the
    # bytes a node sends in the masked stage are one vector, not one per user.
    nodes, driver = start(tmp_path)
    sizes = {}

    def exchange(stage, payloads):
        out = nodes.exchange(stage, payloads)
        if stage == "masked":
            sizes.update({n: len(rep["group"]) for n, rep in out.items()})
        return out

    driver.exchange = exchange
    out = nodes.run_round(driver, 1, ALL)
    assert out.contributors == ALL and np.array_equal(out.total, reference(ALL, 1))
    header, per_user = 16, 4 + SIGNATURE_BYTES
    assert sizes == {n: header + 8 * DIM + per_user * len(us) for n, us in USERS_OF.items()}
    assert SETUP.dim == DIM


def test_two_masked_messages_answered_at_once_give_one_group(tmp_path):
    # Without resident engines Flower starts a process per message: a server sending node 0 the masked stage
    # twice at once would have both processes read the users' attempts before either wrote it. The node's stage
    # lock makes the second wait and find its users sealed.
    import threading

    nodes, driver = start(tmp_path)
    answers: list[dict] = []

    def exchange(stage, payloads):
        out = nodes.exchange(stage, {n: p for n, p in payloads.items() if not (stage == "masked" and n == 0)})
        if stage == "masked":
            got = messages_of(from_record(to_record(payloads[0])))
            run = lambda: answers.append(reply(nodes.node(0).step("masked", got, nodes.inputs)))  # noqa: E731
            threads = [threading.Thread(target=run) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out[0] = next(a for a in answers if "group" in a)
        return out

    driver.exchange = exchange
    with pytest.raises(RoundSkipped):  # the users that refused the second message abort, as in the attack above
        nodes.run_round(driver, 1, ALL)
    assert sorted("group" in a for a in answers) == [False, True]  # one group; the other message: every user refused
    refused = next(a for a in answers if "group" not in a)
    assert refused == {f"x:{u}": "already_answered" for u in USERS_OF[0]}
