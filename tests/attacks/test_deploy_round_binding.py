"""Attack: a deployed server gets a second sum of one round's inputs over another set, and differences the two.

Two sums of the same inputs over sets that differ by one user give that user's
upload (to half a grid step; under distributed DP, its clipped vector plus one
noise share). Secure aggregation must release at most one sum per round. The
attacker is the deployment's server: the real ServerApp code (``run_server``
over :class:`InProcessGrid`) with its own signing key, the nodes the real
ClientApp handlers over their state directories. The attacks:

* relabelling: after round 1's release the server signs a new attempt "round 2"
  but sends the stages ``round = 1`` over the others, with no train stage, so
  the nodes mask the vectors they kept for round 1 (since issue 35 a node
  answers no advertise stage outside a train message); or it has a node train
  one round under the announcement of another;
* a new session: the server sets up the session again (what a resumed server
  does), the nodes join it, and the server runs round 1 again over the others;
* an honest resume: a server killed after round 2's release and before its
  checkpoint resumes while one node is down, and re-runs round 2 over fewer users;
* BFV: the server asks a node for a second encrypted partial sum of round 1 over
  its users but one.

Before the fix (commit e24caf5) the relabelling, the new session and the resume
each released a second sum: the first two gave the victim's exact upload (to
about 1e-12) and the resume the sum of the missing node's users; the BFV node
summed the subset without complaint (the key holder's one-release-per-round
record was the only barrier).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers.malicious import standalone_adverts

pytest.importorskip("flwr")

from fedrecgel_secure.privacy.secagg.errors import RoundSkipped

from helpers.deploy import BFV, MASKING, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid, server_killed_before_checkpoint


class Deployed:
    """A deployment's run, with what the test (not the attacker) can see: each user's kept input, by round, and
    every sum the server's masking driver released."""

    def __init__(self, tmp_path: Path, monkeypatch, extra: str, rounds: int = 1):
        from fedrecgel_secure.deploy.node.masking_node import MaskingNode
        from fedrecgel_secure.deploy.server.masking_driver import MaskingDriver
        from fedrecgel_secure.deploy.server.masking_summer import NodeMaskingSum
        from fedrecgel_secure.deploy.server.remote import RemoteTrainer

        self.policy = write_deploy_policy(tmp_path, extra, rounds, 3, timeout=1.0, heartbeat=0.05)
        self.out = tmp_path / "deployed"
        self.key_holder = "bfv" in extra
        self.trainers: list[RemoteTrainer] = []
        self.inputs: dict[tuple[int, int], np.ndarray] = {}  # (round, user) -> the vector its node kept
        self.released: list[tuple[int, object]] = []  # (round, RoundResult or None if skipped), by the driver
        self.summed: list[tuple[int, list[int], object]] = []  # (round, contributors, total or None), by the summer
        init, keep, run_round = RemoteTrainer.__init__, MaskingNode.keep_inputs, MaskingDriver.run_round
        summer = NodeMaskingSum.__call__

        def keep_inputs(node, round_idx, clients, vectors, *rest, **kwargs):
            for pos, u in enumerate(np.asarray(clients).tolist()):
                self.inputs[(round_idx, u)] = np.array(vectors[pos])
            return keep(node, round_idx, clients, vectors, *rest, **kwargs)

        def recorded(driver, round_idx, *args, **kwargs):
            try:
                out = run_round(driver, round_idx, *args, **kwargs)
            except RoundSkipped:
                self.released.append((round_idx, None))
                raise
            self.released.append((round_idx, out))
            return out

        def summed(sum_, round_idx, contributions, **kwargs):
            out = summer(sum_, round_idx, contributions, **kwargs)
            users = np.asarray(contributions.clients)[out.contributors].tolist()
            self.summed.append((round_idx, users, None if out.total is None else out.total.numpy()))
            return out

        monkeypatch.setattr(RemoteTrainer, "__init__", lambda t, *a: init(t, *a) or self.trainers.append(t))
        monkeypatch.setattr(NodeMaskingSum, "__call__", summed)
        monkeypatch.setattr(MaskingNode, "keep_inputs", keep_inputs)
        monkeypatch.setattr(MaskingDriver, "run_round", recorded)

    def grid(self, down=None) -> InProcessGrid:
        key_holder_dir = self.out / "nodes" / "keyholder" if self.key_holder else None
        return InProcessGrid(self.policy, [self.out / "nodes" / str(s) for s in range(3)], down, key_holder_dir)

    def run(self, resume: bool = False, down=None):
        from fedrecgel_secure.deploy.server.serverapp import run_server

        grid = self.grid(down)
        run_server(grid, self.policy, self.out, resume=resume, catalogue=grid.catalogue)

    @property
    def server(self):
        return self.trainers[-1]


def _leak(first, second, victim_input) -> str:
    """What the attacker learns from the two sums: the victim's upload, and how exactly."""
    error = np.abs((first.total - second.total) - victim_input).max()
    return f"first sum minus second sum is the victim's upload to {error:.1e}"


def test_a_server_relabelling_a_released_rounds_inputs_for_a_new_attempt_gets_no_sum(tmp_path, monkeypatch):
    # The server signs an attempt of round 2 (accepted: the users confirmed round 1 only) and sends its stages with
    # the payload's round = 1, over round 1's contributors but the victim, with no train stage. Before issue 35 a
    # node answered the standalone advertise stage and then refused at the masked stage (it holds no input of the
    # signed round 2: ``out_of_phase``); now no node answers an advertise stage outside a train message at all.
    run = Deployed(tmp_path, monkeypatch, MASKING)
    run.run()
    (r, first), *_ = run.released
    assert r == 1 and first is not None and len(first.contributors) >= 3
    victim, others = first.contributors[0], first.contributors[1:]
    driver = run.server.aggregation.summer.driver
    exchange = driver.exchange
    driver.exchange = lambda stage, payloads: exchange(stage, {n: {**p, "round": 1} for n, p in payloads.items()})
    adverts = standalone_adverts(driver, 2, others)
    assert adverts == {}  # every node refused the stage: no user advertised, no attempt started
    try:
        second = driver.run_round(2, others, adverts=adverts)
    except RoundSkipped:
        pass
    else:
        pytest.fail(_leak(first, second, run.inputs[(1, victim)]))


def test_a_train_message_announcing_another_round_than_it_trains_gets_no_advert(tmp_path, monkeypatch):
    # The relabelling through the train stage: the server has node s train round 1 again (its inputs are kept for
    # round 1) but signs the attempt that rides on the message as round 2, so that round 1's inputs would be masked
    # in an attempt of round 2 as well as in round 1's. Every user refuses the announcement: no attempt starts.
    run = Deployed(tmp_path, monkeypatch, MASKING)
    run.run()
    server = run.server
    summer = server.aggregation.summer
    # node 0's very users of round 1: a message for a round label over another set of users who trained it is
    # refused before any scheme's check (round_used, deploy.node.answers); this one is answered from the stored
    # round 1, and the attempt riding on it is what the users judge
    users = np.intersect1d(server.contributors[1], summer.users_of[0]).astype(np.int64)
    assert users.size
    common = server._common(0)
    from fedrecgel_secure.deploy.messages import train_binding

    binding = train_binding(common["shared"], int(users.size), None)  # bound to the model, as an honest one is
    common.update(announce=summer.driver.begin(2, binding=binding), dim=summer.setup.dim, participants=int(users.size))
    replies = server.stages.train(1, {0: users}, common)
    assert {k: v for k, v in replies[0].items() if k[:2] in ("r:", "x:")} == {
        f"x:{u}": "wrong_round" for u in users.tolist()
    }


@pytest.mark.parametrize("scheme", ["masking", "bfv"])
def test_a_train_message_for_a_round_past_the_run_is_refused(tmp_path, monkeypatch, capsys, scheme):
    # A round label the run does not have (a one-round run asked to train round 2, 100 or 10**9) would give the
    # server more sums than the policy plans for and, under BFV, fresh labels to probe the key holder with
    # (issue 35, finding 4: the key holder answered 40 probes under labels 100-139; an aggregate's label is bound by
    # its users' signatures). Before issue 35 a node trained, advertised or summed any round it was sent (node 0
    # summed label 2 of a one-round run under BFV); now it refuses a label outside 1 .. federation.rounds.
    from fedrecgel_secure.deploy.messages import train_binding

    run = Deployed(tmp_path, monkeypatch, MASKING if scheme == "masking" else BFV)
    run.run()
    server = run.server
    summer = server.aggregation.summer
    users = np.asarray(summer.users_of[0][:3], dtype=np.int64)
    capsys.readouterr()
    for label in (2, 100, 10**9):
        common = {**server._common(1), "dim": summer.setup.dim, "participants": int(users.size)}
        if scheme == "masking":  # the attempt announced with the message, bound to its model, as an honest one is
            common["announce"] = summer.driver.begin(label, binding=train_binding(common["shared"], 3, None))
        assert server.stages.train(label, {0: users}, common) == {}  # node 0 refused: no advert, no partial
    assert capsys.readouterr().out.count("NodeError('not_a_round')") == 3  # the reason class, nothing else
    assert not list((run.out / "nodes" / "0" / "secagg").glob("inputs-*.npz"))


def test_a_new_session_does_not_reopen_a_confirmed_round(tmp_path, monkeypatch):
    # The server sets up a new session (a resumed server's first step: keys, join), then runs round 1 again over
    # its contributors but the victim, its attempt announced in round 1's train message, as an honest round's is.
    # The users' record of the rounds they confirmed outlives the session: all refuse the new attempt of round 1.
    from fedrecgel_secure.deploy.messages import train_binding

    run = Deployed(tmp_path, monkeypatch, MASKING)
    run.run()
    (_, first), *_ = run.released
    victim, others = first.contributors[0], first.contributors[1:]
    server = run.server
    summer = server.aggregation.summer
    summer.start()
    common = server._common(0)
    binding = train_binding(common["shared"], len(others), None)
    common.update(announce=summer.announce(1, None, binding), dim=summer.setup.dim, participants=len(others))
    per_shard = {}
    for u in others:
        per_shard.setdefault(int(server.shard[u]), []).append(int(u))
    replies = server.stages.train(1, {s: np.asarray(us, dtype=np.int64) for s, us in per_shard.items()}, common)
    summer.received(replies)
    try:
        second = summer.driver.run_round(1, others, adverts=replies)
    except RoundSkipped as skipped:
        # a node whose users of round 1 are asked again as another set refuses first (round_used: no advert), one
        # asked for the very same set answers from its stored round 1, and its users refuse the new attempt
        assert set(skipped.rejected) <= set(others)
        assert set(skipped.rejected.values()) <= {"already_answered"}
    else:
        pytest.fail(_leak(first, second, run.inputs[(1, victim)]))
    # and the inputs of a confirmed round are gone from the nodes
    assert not list((run.out / "nodes").glob("*/secagg/inputs-1.npz"))


@pytest.mark.slow  # two deployments, killed then resumed; CI runs it
def test_a_resumed_server_rerunning_a_released_round_over_fewer_users_gets_the_same_sum_or_none(tmp_path, monkeypatch):
    # An honest server dies after round 2's release and before its checkpoint; it resumes while node 2 is down,
    # so round 2 runs again over the users of nodes 0 and 1 only. The difference of the two sums would be node 2's
    # users' sum (one user's upload when one was sampled there). The users refuse the new attempt: no second sum.
    from fedrecgel_secure.runs.checkpoint import load_checkpoint

    run = Deployed(tmp_path, monkeypatch, MASKING, rounds=2)
    with server_killed_before_checkpoint(2):
        run.run()
    assert load_checkpoint(run.out / "checkpoint.pt")["round"] == 1
    run.run(resume=True, down={2: ("round-2",)})
    (_, users, total), (_, again_users, again) = [(r, u, t) for r, u, t in run.summed if r == 2]
    assert total is not None
    if again is not None:
        missing = sorted(set(users) - set(again_users))
        assert again_users == users and np.array_equal(again, total), (
            f"a second sum of round 2 without users {missing}: the difference is their sum"
        )


def test_a_bfv_node_sums_a_round_once_over_one_set_of_its_users(tmp_path, monkeypatch, capsys):
    # After round 1's release the server sends node s round 1's train message again with one of its sampled users
    # left out. The node refuses a second partial sum of round 1 over another set of its users; the same set again
    # (an honest resume) still gets its sum.
    run = Deployed(tmp_path, monkeypatch, BFV)
    run.run()
    server = run.server
    counted = np.asarray(server.contributors[1], dtype=np.int64)
    shard = next(s for s in range(3) if (server.shard[counted] == s).sum() >= 2)
    sampled = counted[server.shard[counted] == shard]
    common = server._common(0)
    common.update(dim=server.aggregation.summer.setup.dim, participants=int(counted.size))
    capsys.readouterr()
    replies = server.stages.train(1, {shard: sampled[1:]}, common)
    assert shard not in replies, "the node summed round 1 again without its user " + str(sampled[0])
    # refused as a second use of round 1 by its users (deploy.node.answers), before the BFV node's own check
    assert "NodeError('round_used')" in capsys.readouterr().out
    replies = server.stages.train(1, {shard: sampled}, common)
    assert "partial" in replies[shard]
