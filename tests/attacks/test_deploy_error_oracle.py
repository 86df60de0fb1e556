"""Attack: a malicious deployment server reads a user's training set from whether its node's reply is an error.

Issue 45, finding 1. The server samples the victim alone on its node and sends a crafted shared model: zeros but
for a huge value in the first MLP coordinate of each probed item's row and huge weights that carry it to the logit,
so that the loss and its gradient are not finite exactly for the probed items. A user whose local set (its training
positives and the round's negatives) holds a probed item got a non-finite upload, and the node failed the stage:
``DPMechanism.protect`` raised "upload norms must be finite", or ``check_upload`` "upload of client 0 contains NaN
or infinity", and the error reply carried that text. Before the fix, with adaptive group testing, the server
recovered the victim's exact training set (11 of 11 items, 0 false positives, in 355 train messages) under masking
with distributed DP, DPF with central DP and BFV, and under cyclic participation too. Here, over the real
ServerApp, handlers and engine on the in-process grid, before the fix: the victim's node failed exactly the probes
that hit its local set, so the two worlds below gave different observations (world A's positives were read).

Now a node refuses a model that is not finite or beyond ``deployment.max_shared_value`` before any user's data is
read (``bad_model``, the same for every node), and a user whose computation still fails (here the node's bound is
lifted so that the 1e30 model reaches training) uploads zeros inside the sum: the node answers every probe with the
same fields and sizes whatever its users hold, and an error reply carries a reason class only. The test runs the
attack in two worlds whose victim holds different items and finds the server's observations identical, so what it
recovers is independent of the victim's data: chance.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, seeded_dp, write_deploy_policy
from helpers.inprocess_grid import InProcessGrid
from helpers.malicious import victim_alone

DPF = BFV.replace("bfv", "dpf")
CYCLIC = MASKING + seeded_dp("distributed") + 'sampler = "cyclic"\n'  # fraction 0.5: b = 2; 4 rounds: k = 2
SCHEMES = {
    "masking + distributed DP": (MASKING + seeded_dp("distributed"), False),
    "dpf + central DP": (DPF + seeded_dp("central"), True),
    "bfv": (BFV, True),
    "masking + distributed DP, cyclic": (CYCLIC, False),
}
HUGE = 1e30
LIFTED = "max_shared_value = 1e38\n"  # [deployment]: the node's bound lifted, so the crafted model reaches training


def poisoned_model(policy, n_items: int, probed: np.ndarray, value: float = HUGE) -> np.ndarray:
    """Zeros, but ``value`` in the first MLP coordinate of each probed item's row and weights of ``value`` that carry
    it to the logit: the logit is +inf, and the gradient not finite, exactly for the probed items."""
    import torch
    from torch.nn.utils import parameters_to_vector

    from fedrecgel_secure.federation.build import init_model

    model, _ = init_model(policy, n_items)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.item_embeddings[torch.from_numpy(probed), model.gmf_dim] = value
        model.mlp[0].weight[0, model.mlp_dim] = value
        model.mlp[2].weight[0, 0] = value
        model.predict.weight[0, model.gmf_dim] = value
    return parameters_to_vector(model.parameters()).detach().numpy()


def world(tmp_path, extra: str, deployment: str, swap: tuple[int, int] | None):
    """The deployment's policy file over the tests' ratings, with the interactions of users ``swap`` exchanged."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    policy_file = write_deploy_policy(tmp_path, extra, rounds=4, nodes=3, timeout=1.0, heartbeat=0.05)
    text = policy_file.read_text().replace("[deployment]\n", "[deployment]\n" + deployment)
    policy_file.write_text(text)
    if swap is not None:
        ratings = tmp_path / "ratings.txt"
        a, b = (str(u + 1) for u in swap)  # the file's ids are 1-based
        lines = [line.split(" ") for line in ratings.read_text().splitlines()]
        swapped = [" ".join([{a: b, b: a}.get(u, u), *rest]) for u, *rest in lines]
        ratings.write_text("\n".join(swapped) + "\n")
    return policy_file


def attack(tmp_path, monkeypatch, extra: str, key_holder: bool, deployment: str, swap=None, messages=None):
    """The attack on one world: per probe (a round), what the server observed of the victim's node's reply (error
    and reason, or its fields and their sizes), and the victim's training items. ``messages(upto, policy,
    n_items)``: the shared vector the server sends in round upto + 1 (default: the poisoned model over the
    probe's items)."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.deploy.server.serverapp import run_server
    from fedrecgel_secure.deploy.wire import from_record
    from fedrecgel_secure.policy import load_policy

    policy_file = world(tmp_path, extra, deployment, swap)
    policy = load_policy(policy_file)
    split = load_split(policy.data)
    victim = int(policy.deployment.shard_users(split.n_users, 0)[0])
    truth = split.train_items[split.train_indptr[victim] : split.train_indptr[victim + 1]]
    out = tmp_path / "deployed"
    holder = out / "nodes" / "keyholder" if key_holder else None
    grid = InProcessGrid(policy_file, [out / "nodes" / str(s) for s in range(3)], None, holder)
    probes = probes_of(np.sort(truth))

    def crafted(trainer, upto):
        n_items = trainer.catalogue.n_items
        return poisoned_model(policy, n_items, probes[upto]) if messages is None else messages(upto, policy, n_items)

    replies = victim_alone(monkeypatch, grid, victim, crafted)
    run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    seen = {
        r: ("error", m.error.reason) if m.has_error() else ("reply", observable(from_record(m.content)))
        for r, m in replies.items()
    }
    return [seen.get(r) for r in range(1, 5)], set(truth.tolist()), victim


def observable(payload: dict) -> list[tuple[str, tuple]]:
    """What the server can compare between replies: each field's name (users' ids made positions) and size."""
    return sorted(
        (k.split(":")[0], np.shape(v) if not isinstance(v, bytes | str) else (len(v),))
        for k, v in payload.items()
        if k != "timing"
    )


def probes_of(truth: np.ndarray) -> dict[int, np.ndarray]:
    """Round R probes: rounds 1 and 3 two of world A's victim's training items each, rounds 2 and 4 none."""
    return {0: truth[:2], 1: np.array([], dtype=np.int64), 2: truth[2:4], 3: np.array([], dtype=np.int64)}


def other_user(tmp_path, victim: int) -> int:
    """A user on another node whose training items share none with the victim's: the swap of world B."""
    from fedrecgel_secure.data.prepare import load_split
    from fedrecgel_secure.policy import load_policy

    (tmp_path / "probe").mkdir(exist_ok=True)
    policy = load_policy(write_deploy_policy(tmp_path / "probe", "", rounds=1, nodes=3))
    split = load_split(policy.data)
    items = lambda u: set(split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]].tolist())  # noqa: E731
    mine = set(policy.deployment.shard_users(split.n_users, 0).tolist())
    return next(u for u in range(split.n_users) if u not in mine and not items(u) & items(victim))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_poisoned_model_gives_the_same_replies_whatever_the_victim_holds(tmp_path, monkeypatch, scheme):
    extra, key_holder = SCHEMES[scheme]
    seen_a, truth_a, victim = attack(tmp_path / "a", monkeypatch, extra, key_holder, LIFTED)
    swap = (victim, other_user(tmp_path, victim))
    seen_b, truth_b, _ = attack(tmp_path / "b", monkeypatch, extra, key_holder, LIFTED, swap=swap)
    probes = probes_of(np.asarray(sorted(truth_a)))
    # the group test: a probe whose reply failed holds an item of the victim's local set
    recovered = {int(i) for r, s in enumerate(seen_a) if s is not None and s[0] == "error" for i in probes[r]}
    print(f"{scheme}: world A {seen_a}\nworld B {seen_b}\nrecovered {sorted(recovered)} of {sorted(truth_a)}")
    assert recovered == set()  # (before the fix: the four items of probes 1 and 3)
    assert truth_a.isdisjoint(truth_b)  # the two victims hold different items
    assert seen_a == seen_b  # so the server's view is a function of what it sent alone
    # every probe answered, none failed; under cyclic participation the victim is refused the rounds its bound
    # leaves out (k = 2, b = 2: rounds 2 and 4), in both worlds alike
    schedule = ("error", "NodeError('participation')")
    assert seen_a[0][0] == seen_a[2][0] == "reply" and all(s[0] == "reply" or s == schedule for s in seen_a)


def test_a_model_beyond_the_nodes_bound_is_refused_with_one_reason_whatever_the_victim_holds(tmp_path, monkeypatch):
    extra, _ = SCHEMES["masking + distributed DP"]
    seen_a, _, victim = attack(tmp_path / "a", monkeypatch, extra, False, "")
    seen_b, _, _ = attack(tmp_path / "b", monkeypatch, extra, False, "", swap=(victim, other_user(tmp_path, victim)))
    assert seen_a == seen_b
    assert all(s == ("error", "NodeError('bad_model')") for s in seen_a)


CRAFTED = {  # the property test's crafted shared vectors, one a round
    "not finite": lambda policy, n: np.full(_size(policy, n), np.nan, dtype=np.float32),
    "huge": lambda policy, n: np.full(_size(policy, n), HUGE, dtype=np.float32),
    "wrong shape": lambda policy, n: np.zeros(_size(policy, n) - 1, dtype=np.float32),
    "zero": lambda policy, n: np.zeros(_size(policy, n), dtype=np.float32),
}


def _size(policy, n_items: int) -> int:
    from fedrecgel_secure.federation.build import init_model

    return sum(p.numel() for p in init_model(policy, n_items)[0].parameters())


@pytest.mark.parametrize("deployment", ["", LIFTED], ids=["bound", "bound lifted"])
def test_crafted_messages_get_replies_whose_fields_sizes_and_status_do_not_depend_on_the_users_data(
    tmp_path, monkeypatch, deployment
):
    kinds = list(CRAFTED)

    def messages(upto, policy, n_items):
        return CRAFTED[kinds[upto]](policy, n_items)

    extra, _ = SCHEMES["masking + distributed DP"]
    seen_a, _, victim = attack(tmp_path / "a", monkeypatch, extra, False, deployment, messages=messages)
    swap = (victim, other_user(tmp_path, victim))
    seen_b, _, _ = attack(tmp_path / "b", monkeypatch, extra, False, deployment, swap=swap, messages=messages)
    print(dict(zip(kinds, seen_a)))
    assert seen_a == seen_b
    status = dict(zip(kinds, seen_a))
    assert status["zero"][0] == "reply" and status["wrong shape"] == ("error", "NodeError('bad_model')")
    assert status["not finite"] == ("error", "NodeError('bad_model')")  # whatever the bound
    assert status["huge"] == (("error", "NodeError('bad_model')") if deployment == "" else status["zero"])
