"""A deployment's recommendations: each node writes its own users' top-K into its state directory after the last
round, the server gets an acknowledgement that carries nothing of them, and the lists are the simulator's."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.cli import bad
from helpers.deploy import MASKING, seeded_dp, simulate, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid

K = 5


@pytest.mark.parametrize("privacy", ["plaintext", "masking + seeded distributed DP"])
def test_each_node_writes_its_users_lists_equal_to_the_simulators_and_the_server_gets_an_acknowledgement(
    tmp_path, privacy
):
    from fedrecgel_secure.deploy.node.recommendations import RECOMMENDATIONS
    from fedrecgel_secure.deploy.replies import ACKNOWLEDGED, undeclared
    from fedrecgel_secure.deploy.server.recommendations import recommend_stage
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.deploy.wire import from_record
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.recommend import open_trained, read_lists, top_k

    extra = f"recommend = {K}\n" + (MASKING + seeded_dp("distributed") if "DP" in privacy else "")
    policy_file = write_deploy_policy(tmp_path, extra, rounds=2, nodes=3, timeout=1.0, heartbeat=0.05)
    sim = tmp_path / "sim"
    simulate(policy_file, sim)  # with the deployment's evaluation scope, which sizes its DP noise
    out = tmp_path / "deployed"
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)])
    replies = []
    pull = grid.pull_messages
    grid.pull_messages = lambda ids: [replies.append(m) or m for m in pull(ids)]
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)

    # what the server received of the recommend stage: one acknowledgement per node, a declared field, no more
    groups = [g for g in grid.groups if g.startswith("recommend")]
    assert groups == ["recommend-2"] * 3
    acks = [from_record(m.content) for m in replies[-3:]]
    assert acks == [ACKNOWLEDGED] * 3
    assert undeclared(load_policy(policy_file), acks[0]) == []
    # the stage journal's last line is the recommend stage's: what `deploy local` waits for before it stops the nodes
    assert recommend_stage(out) | {"seconds": 0, "parts": {}} == {
        "stage": "recommend-2",
        "type": "query.recommend",
        "seconds": 0,
        "sent": 3,
        "answered": 3,
        "parts": {},
    }

    # the union of the nodes' files is the simulator's every list, by the split's indices
    run = open_trained(sim)
    items, scores = top_k(run.model, run.theta, run.split, np.arange(run.split.n_users), K)
    lists = {}
    for s in range(3):
        path = out / "nodes" / str(s) / RECOMMENDATIONS
        assert path.stat().st_mode & 0o077 == 0
        lists.update(read_lists(path))
    assert sorted(map(int, lists)) == list(range(run.split.n_users))
    for u in range(run.split.n_users):
        assert [int(i) for i, _ in lists[str(u)]] == items[u].tolist(), u
        assert [s for _, s in lists[str(u)]] == pytest.approx(scores[u].tolist(), abs=1e-6)
    assert not (out / RECOMMENDATIONS).exists()

    # the server's run directory holds no user embedding: `recommend` says so and where the lists are; an export
    # holds the shared model alone, and asking it for the user embeddings is refused
    bad(["recommend", out, "--user", "1"], "a deployment's run directory holds no user embeddings", tmp_path)
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.export import export_run, load_export

    export_run(out, tmp_path / "export")
    model, theta, card = load_export(tmp_path / "export")
    assert theta is None and card["contents"]["user_embeddings"] is None
    assert all(np.array_equal(model.state_dict()[k], v) for k, v in run.model.state_dict().items())
    with pytest.raises(BadInputError, match="no user embeddings"):
        export_run(out, tmp_path / "export2", include_user_embeddings=True)


def test_the_relay_clientapp_forwards_every_message_type_the_handlers_answer():
    # a handler the relay does not register never runs on a real SuperNode (flwr refuses the message type there),
    # whatever the in-process grid, which calls the engine directly, shows; flwr 1.42 keeps them in _registered_funcs
    from fedrecgel_secure.deploy.node import clientapp, handlers

    assert "query.recommend" in handlers.app._registered_funcs
    assert set(clientapp.app._registered_funcs) == set(handlers.app._registered_funcs)
