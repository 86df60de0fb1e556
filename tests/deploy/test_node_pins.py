"""Pinned node keys: the policy's ``[deployment] node_keys``, ``nodes.json``, the signed hello, ``deploy plan`` and
``fedrecgel deploy identity`` (the attacks are in tests/attacks/test_deploy_shard_binding.py)."""

from __future__ import annotations

import json
import stat

import pytest

from fedrecgel_secure.errors import BadInputError

KEY = "ab" * 32


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f'deployment.node_keys={{"3" = "{KEY}"}}'], "deployment.node_keys.3: no such node"),
        (['deployment.node_keys={"1" = "not-hex"}'], "deployment.node_keys.1"),
        ([f'deployment.node_keys={{"1" = "{KEY[:-2]}"}}'], "deployment.node_keys.1"),
    ],
)
def test_node_keys_in_the_policy_are_checked_with_their_field_named(overrides, message):
    from fedrecgel_secure.policy import load_policy

    with pytest.raises(BadInputError, match=message):
        load_policy(None, overrides)


def test_node_keys_in_the_policy_pin_shards_and_the_key_holder():
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(None, [f'deployment.node_keys={{"0" = "{KEY}", "keyholder" = "{"cd" * 32}"}}'])
    assert policy.deployment.node_keys == {"0": KEY, "keyholder": "cd" * 32}
    assert policy.digest() == load_policy(None).digest()  # where the roles run, not what is computed


def test_nodes_json_is_read_back_and_a_contradicting_policy_key_is_bad_input(tmp_path):
    from fedrecgel_secure.deploy.server.pins import NODE_PINS, read_pins, write_pins

    write_pins(tmp_path, {"1": KEY, "0": "cd" * 32})
    assert read_pins(tmp_path, {}) == {"0": "cd" * 32, "1": KEY}
    assert read_pins(tmp_path, {"1": KEY, "2": "ef" * 32}) == {"0": "cd" * 32, "1": KEY, "2": "ef" * 32}
    with pytest.raises(BadInputError, match=rf"deployment.node_keys.1 = .*{NODE_PINS} pins node 1"):
        read_pins(tmp_path, {"1": "ef" * 32})
    (tmp_path / NODE_PINS).write_text(json.dumps({"version": 1, "identity": {"1": "xyz"}}))
    with pytest.raises(BadInputError, match=rf"{NODE_PINS}: not a pins file of this version \(identity.1:"):
        read_pins(tmp_path, {})
    (tmp_path / NODE_PINS).write_text("{")
    with pytest.raises(BadInputError, match=f"{NODE_PINS}: not JSON"):
        read_pins(tmp_path, {})


def test_a_signed_hello_verifies_only_over_its_own_nonce_and_digest(tmp_path):
    from fedrecgel_secure.deploy.node.hello import signed_hello
    from fedrecgel_secure.deploy.server.pins import check_hello, new_nonce

    nonce = new_nonce()
    reply = signed_hello(tmp_path / "n", 2, "digest", nonce)
    claim = check_hello(7, reply, nonce, "digest")
    assert (claim.who, claim.refused, claim.identity) == ("2", None, reply["identity"].hex())
    assert "does not verify" in check_hello(7, reply, new_nonce(), "digest").refused
    assert "different policy" in check_hello(7, reply, nonce, "other").refused
    assert "the reply says '1'" in check_hello(7, {**reply, "shard": 1}, nonce, "digest").refused
    assert "not a signed hello" in check_hello(7, {**reply, "hello": reply["hello"][:-1]}, nonce, "digest").refused
    flipped = reply["hello"][:-1] + bytes([reply["hello"][-1] ^ 1])
    assert "does not verify" in check_hello(7, {**reply, "hello": flipped}, nonce, "digest").refused
    holder = signed_hello(tmp_path / "kh", "keyholder", "digest", nonce)
    assert check_hello(8, holder, nonce, "digest").who == "keyholder"


def test_binding_takes_the_pinned_key_refuses_the_rest_and_never_picks_between_unpinned_claims():
    from fedrecgel_secure.deploy.server.pins import Claim, bind

    pins = {"0": KEY}
    claims = [
        Claim(10, "0", "ee" * 32),  # not shard 0's pinned key
        Claim(11, "0", KEY),
        Claim(12, "1", "cd" * 32),
        Claim(13, "1", "dd" * 32),  # a second claim of unpinned shard 1
        Claim(14, "2", "ff" * 32),
        Claim(15, "3", "99" * 32),  # no such shard
        Claim(16, "keyholder", "ff" * 32),  # shard 2's key, answering for the key holder as well
    ]
    bound, refused = bind(claims, pins, ["0", "1", "2", "keyholder"])
    assert bound == {"0": 11}
    assert {c.node_id for c in refused} == {10, 12, 13, 14, 15, 16}
    assert pins == {"0": KEY}  # nothing new pinned
    bound, _ = bind([Claim(12, "1", "cd" * 32)], pins, ["0", "1"])
    assert bound == {"1": 12} and pins == {"0": KEY, "1": "cd" * 32}  # first contact pins


def test_the_plan_has_each_node_print_its_identity_key_and_the_operator_pin_it():
    from fedrecgel_secure.deploy.launch.plan import plan
    from fedrecgel_secure.policy import load_policy

    bfv = 'privacy.secure_aggregation.scheme="bfv"'
    text = plan(load_policy(None, [bfv, f'deployment.node_keys={{"0" = "{KEY}"}}']))
    assert "fedrecgel deploy identity nodes/1" in text and "fedrecgel deploy identity nodes/keyholder" in text
    assert "[deployment.node_keys]" in text and f'"0" = "{KEY}"' in text
    assert '"1" = "<the key node 1 printed>"' in text and '"keyholder" = "<the key the key holder printed>"' in text


def test_deploy_local_pins_every_nodes_and_the_key_holders_key_in_the_policy_they_all_read(tmp_path):
    # the nodes and the key holder take the set-up's keys only under the pins of their own policy file
    # (deploy/node/pinned.py): a local deployment fills them in from the keys it makes in each state directory
    from fedrecgel_secure.deploy.launch.layout import POLICY_FILE, pin_identities
    from fedrecgel_secure.deploy.launch.local import Deployment
    from fedrecgel_secure.deploy.node.files import state_dir_for
    from fedrecgel_secure.deploy.node.hello import identity_key
    from fedrecgel_secure.policy import load_policy

    policy = load_policy(None, ['privacy.secure_aggregation.scheme="dpf"', "deployment.nodes=2"])
    dep = Deployment(policy, tmp_path / "dep")
    pinned = load_policy(tmp_path / "dep" / POLICY_FILE).deployment.node_keys
    assert pinned == {w: identity_key(state_dir_for(policy, dep.out, w)) for w in ("0", "1", "keyholder")}
    assert pinned == dep.policy.deployment.node_keys
    with pytest.raises(BadInputError, match="deployment.node_keys.0 = abab"):  # a pin is never silently replaced
        pin_identities(load_policy(None, [f'deployment.node_keys={{"0" = "{KEY}"}}']), {"0": dep.out / "nodes" / "0"})


def test_deploy_identity_prints_the_key_the_node_signs_with(tmp_path):
    from typer.testing import CliRunner

    from fedrecgel_secure.cli.main import app
    from fedrecgel_secure.deploy.node.files import IDENTITY
    from fedrecgel_secure.deploy.node.hello import signed_hello
    from fedrecgel_secure.deploy.server.pins import check_hello

    result = CliRunner().invoke(app, ["deploy", "identity", str(tmp_path / "node")])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((tmp_path / "node" / IDENTITY).stat().st_mode) == 0o600
    again = CliRunner().invoke(app, ["deploy", "identity", str(tmp_path / "node")])
    assert again.output == result.output  # the same key, not a new one
    claim = check_hello(1, signed_hello(tmp_path / "node", 0, "d", b"n" * 32), b"n" * 32, "d")
    assert claim.identity == result.output.strip()


def _grid_busy_at_first_hello(policy_file, state_dirs):
    """The in-process grid, its last node missing the first hello sent to it: a SuperNode still busy with an
    interrupted run's message (it handles one at a time) lets that hello expire."""
    from helpers.inprocess_grid import InProcessGrid

    class Busy(InProcessGrid):
        missed = 0

        def push_messages(self, messages):
            ids = []
            for m in messages:
                if m.metadata.group_id == "hello" and m.metadata.dst_node_id == max(self.configs) and not self.missed:
                    self.missed, ids = 1, [*ids, "expired"]  # accepted by the SuperLink, never answered
                else:
                    ids += super().push_messages([m])
            return ids

    return Busy(policy_file, state_dirs)


def test_a_node_that_missed_the_first_hello_is_asked_again_and_keeps_its_shard(tmp_path):
    """CI once lost a shard for a whole resumed run: the node answered only after its first hello expired."""
    pytest.importorskip("flwr")
    from fedrecgel_secure.deploy.server.stages import FlowerStages
    from fedrecgel_secure.policy import load_policy

    from helpers.deploy import write_deploy_policy

    policy_file = write_deploy_policy(tmp_path, "", rounds=1, nodes=3, timeout=0.5, heartbeat=0.05)
    grid = _grid_busy_at_first_hello(policy_file, [tmp_path / "nodes" / str(s) for s in range(3)])
    policy = load_policy(policy_file)
    log = []
    stages = FlowerStages(grid, policy.deployment, policy.digest(), log=log.append, run_dir=tmp_path)
    stages.connect(wait=2.0)
    assert grid.missed == 1
    assert sorted(stages.node_of) == [0, 1, 2], log
    assert not any("have no node" in line for line in log)
