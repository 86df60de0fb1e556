"""Attack: a curious deployment server learns its users' interactions from what it reads and what the nodes send.

The attacker runs the server: everything the server process opens, and every
reply the nodes send it, is theirs. The deployment is the real one (ServerApp,
``FlowerStages``, the record encoding, the nodes' ClientApp) on the in-process
grid (``tests/inprocess_grid.py``); only the SuperLink and the processes are
missing. None of this is covered by DP or secure aggregation, which protect the
model updates only.

Before the fix (issue #22; these tests run on e24caf5, adapted to its harness):

- the server process read the whole dataset (``load_split`` in ``run_server``): it opened the ratings file
  (``PermissionError: the server process opened .../ratings.txt``), i.e. every user's interactions;
- each evaluation reply carried every hosted user's candidate scores, column 0 the held-out item: the
  server recovered the held-out item's rank of all 24 users (and so whether each kept it in its top 10);
- under masking each train reply carried every sampled user's loss and number of examples: the server
  recovered the exact number of training interactions of all 19 users sampled in the 2 rounds;
- the server built the simulator's secure aggregation before replacing its summer: under BFV the server
  process made a BFV secret context (the simulated key holder's, able to decrypt every upload) and a
  session with an identity key for every user.

Now the server reads only the public manifest (catalogue size, users per node),
and the nodes send sums over their users: no user's rank, and under secure aggregation or DP no loss or count.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, run_records, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid

# what the audit hook watches: set while a test runs a server, None otherwise (the hook stays installed)
_WATCH: dict = {"grid": None, "private": (), "opened": []}


def _audit(event: str, args) -> None:
    watch = _WATCH
    if event != "open" or watch["grid"] is None or watch["grid"].in_node:
        return
    path = args[0]
    if isinstance(path, int):
        return
    path = os.path.realpath(os.fsdecode(path))
    if any(path == p or path.startswith(p + os.sep) for p in watch["private"]):
        watch["opened"].append(path)
        raise PermissionError(f"the server process opened {path}")


sys.addaudithook(_audit)


def _serve(tmp_path: Path, extra: str, rounds: int = 1, watch_opens: bool = False, on_grid=None):
    """Run the deployed server to the end; every reply it pulled, by stage group."""
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.deploy.wire import from_record

    policy_file = write_deploy_policy(tmp_path, extra, rounds, nodes=3, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    key_holder = out / "nodes" / "keyholder" if "bfv" in extra else None
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, key_holder)
    if on_grid is not None:
        on_grid(grid)
    pulled: list[tuple[str, dict]] = []
    pull = grid.pull_messages

    def pull_and_keep(ids):
        replies = pull(ids)
        pulled.extend((m.metadata.group_id, from_record(m.content)) for m in replies)
        return replies

    grid.pull_messages = pull_and_keep
    if watch_opens:
        # the interaction data: the raw file, its prepared split in the cache, and the nodes' shards (the public
        # manifest beside them is the server's to read)
        private = [tmp_path / "ratings.txt", Path(os.environ["FEDRECGEL_CACHE"]), *(out / "shards").glob("shard-*")]
        _WATCH.update(grid=grid, private=tuple(os.path.realpath(p) for p in private), opened=[])
    try:
        run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    finally:
        _WATCH["grid"] = None
    return pulled, out


def _replies(pulled, prefix: str) -> list[dict]:
    return [rep for group, rep in pulled if group.startswith(prefix)]


def _watched_run(tmp_path: Path, extra: str, rounds: int) -> dict:
    pulled, _ = _serve(tmp_path, extra, rounds, watch_opens=True)
    return {"dir": tmp_path, "pulled": pulled, "opened": list(_WATCH["opened"])}


# one deployed run per setting, each read by several tests (what they read is the run's, they change nothing)
@pytest.fixture(scope="module")
def plaintext_run(tmp_path_factory) -> dict:
    return _watched_run(tmp_path_factory.mktemp("plaintext"), "", rounds=1)


@pytest.fixture(scope="module")
def masking_run(tmp_path_factory) -> dict:
    return _watched_run(tmp_path_factory.mktemp("masking"), MASKING, rounds=2)


@pytest.mark.parametrize("run", ["plaintext_run", "masking_run"])
def test_the_server_process_opens_no_interaction_data(request, run):
    # Every file the server process opens while it runs (outside the nodes' handlers, which the in-process grid
    # runs in the same process) is checked against the interaction data: the ratings file, the prepared split's
    # cache, the shards. Before: run_server's load_split opened the cache (or the ratings file).
    assert request.getfixturevalue(run)["opened"] == []


def test_the_evaluation_replies_give_the_server_no_users_held_out_rank(plaintext_run):
    # The attack: any array in an evaluation reply with one row per hosted user and a column per candidate is
    # read as candidate scores, column 0 the held-out item; its rank is whether the user kept that item.
    replies = _replies(plaintext_run["pulled"], "eval-")
    assert replies
    recovered = {}
    for rep in replies:
        for value in rep.values():
            if isinstance(value, np.ndarray) and value.ndim == 2 and value.shape[1] == 21:  # 1 + 20 test negatives
                ranks = (value[:, 1:] > value[:, :1]).sum(axis=1)
                users = rep.get("users", np.arange(len(ranks)))
                recovered.update(zip(np.atleast_1d(users).tolist(), ranks.tolist()))
    print(f"held-out ranks recovered: {len(recovered)} users")
    assert recovered == {}
    # what a node sends instead: its number of users and their metrics summed
    assert all(set(rep) == {"users", "sums"} and isinstance(rep["users"], int) for rep in replies)
    assert all(isinstance(v, float) for rep in replies for v in rep["sums"].values())


def test_under_masking_no_reply_carries_an_evaluation_outside_the_sum(masking_run):
    # Under secure aggregation a node answers no evaluation of its own (a crafted model made its sums an oracle
    # for what its users hold out, tests/attacks/test_deploy_evaluation_oracle.py): round 1's metrics come with
    # round 2's train stage inside the masked uploads, and no reply has a field of an evaluation.
    pulled = masking_run["pulled"]
    assert not _replies(pulled, "eval-")
    assert all(not {"evaluation", "users", "sums"} & set(rep) for _, rep in pulled)
    records = run_records(masking_run["dir"] / "deployed")
    assert records[0]["evaluated_by"] == "round" and "hr@10" in records[0] and "hr@10" not in records[-1]


def test_under_masking_the_train_replies_give_the_server_no_users_interaction_count(masking_run):
    # The attack: a per-client example count is (1 + train_negatives) x the user's training interactions.
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import load_policy

    pulled = masking_run["pulled"]
    policy = load_policy(masking_run["dir"] / "policy.toml")
    truth = load_split(policy.data).train_counts()
    recovered = {}
    for rep in _replies(pulled, "round-"):
        examples = np.atleast_1d(np.asarray(rep.get("examples", [])))
        if examples.size == rep["clients"].size:  # one count per sampled client
            for client, n in zip(rep["clients"].tolist(), examples.tolist()):
                recovered[client] = n // (1 + policy.data.train_negatives)
    exact = sum(truth[c] == n for c, n in recovered.items())
    print(f"interaction counts recovered exactly: {exact} of {len(recovered)} users")
    assert exact == 0
    # what a node sends instead: no loss, no count (since issue 35: a node's sum of one sampled user was that
    # user's, tests/attacks/test_deploy_loss_oracle.py) and no upload vector
    for rep in _replies(pulled, "round-"):
        assert not {"bce", "examples", "rows", "row_item", "row_owner", "mlp"} & set(rep)


def test_under_bfv_the_server_process_makes_no_secret_key_and_no_simulated_session(tmp_path, monkeypatch):
    # The key holder's secret context may be made only on the key holder's node; the server runs the protocol's
    # server side (NodeBFVSum), never the simulator's SecureSum with its in-process clients and key holder.
    from fedrecgel_secure.federation.summers import SecureSum
    from fedrecgel_secure.privacy.secagg.bfv.params import BFVParams

    made: list[tuple[str, bool]] = []  # (what, on a node)
    grids = []
    context, session = BFVParams.context, SecureSum.__init__

    def recording_context(self):
        made.append(("secret context", grids[0].in_node))
        return context(self)

    def recording_session(self, *args, **kwargs):
        made.append(("simulated session", grids[0].in_node))
        return session(self, *args, **kwargs)

    monkeypatch.setattr(BFVParams, "context", recording_context)
    monkeypatch.setattr(SecureSum, "__init__", recording_session)
    _serve(tmp_path, BFV, on_grid=grids.append)
    print(f"made in the server process: {[what for what, on_node in made if not on_node]}")
    assert ("secret context", True) in made  # the key holder's, on its node
    assert [what for what, on_node in made if not on_node] == []


def test_without_secure_aggregation_a_node_reports_its_users_metrics_summed_never_one_a_user(tmp_path):
    # Central DP with no secure sum: the uploads reach the server in the clear, and under evaluation scope "round"
    # so do the round's metrics. A per-user row would be each sampled user's HR on a model the server chose (which
    # of its held-out item it ranks first); a node sends its users' sum, one row, as its evaluation sums did before.
    from helpers.deploy import seeded_dp

    pulled, out = _serve(tmp_path, seeded_dp("central"), rounds=2)
    carried = [rep for rep in _replies(pulled, "round-") if "reports" in rep]
    assert carried  # round 2's train replies carry round 1's metrics
    for rep in carried:
        assert np.asarray(rep["reports"]).shape == (2,)  # HR@10 and NDCG@10, summed over the node's sampled users
        assert np.asarray(rep["clients"]).size >= 1
    records = run_records(out)
    assert records[0]["evaluated_by"] == "round" and 0 <= records[0]["hr@10"] <= 1
