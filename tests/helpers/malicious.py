"""What the attack tests' malicious server does and what they measure: a grid that tampers with messages, a spy on
the vectors nodes clip and the sums released, a model crafted to read a loss."""

from __future__ import annotations

import numpy as np

from helpers.inprocess_grid import FIRST_NODE_ID, InProcessGrid


class TamperingGrid(InProcessGrid):
    """The real ServerApp's messages, changed by ``tamper(group, payload)`` on their way to the nodes."""

    def __init__(self, *args, tamper, **kwargs):
        super().__init__(*args, **kwargs)
        self.tamper = tamper
        self.refusals: list[tuple[str, str]] = []  # (group, the node's reason), as the server logs them

    def push_messages(self, messages):
        from fedrecgel_secure.deploy.wire import from_record, to_record

        messages = list(messages)
        for msg in messages:
            payload = from_record(msg.content)
            if self.tamper(msg.metadata.group_id, payload):
                msg.content = to_record(payload)
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            reply = self.replies.get(mid)
            if reply is not None and reply.has_error():
                self.refusals.append((msg.metadata.group_id, reply.error.reason))
        return ids


class Observed:
    """What the attack is measured on: the clipped vectors the nodes handed over, and the sums the server released."""

    def __init__(self, monkeypatch):
        from fedrecgel_secure.deploy.node.shard import Node
        from fedrecgel_secure.deploy.server.bfv_summer import NodeBFVSum
        from fedrecgel_secure.deploy.server.masking_summer import NodeMaskingSum

        self.vectors: dict[tuple[int, int], np.ndarray] = {}  # (round, client) -> its clipped vector
        self.releases: list[tuple[int, np.ndarray, np.ndarray]] = []  # (round, contributor ids, released total)
        protect = Node.protect

        def spy_protect(node, round_idx, clients, *args, **kwargs):
            vectors, shares = protect(node, round_idx, clients, *args, **kwargs)
            for c, v in zip(np.asarray(clients).tolist(), vectors):
                self.vectors[(round_idx, c)] = v
            return vectors, shares

        monkeypatch.setattr(Node, "protect", spy_protect)
        for summer in (NodeMaskingSum, NodeBFVSum):
            monkeypatch.setattr(summer, "__call__", self._spy_sum(summer.__call__))

    def _spy_sum(self, call):
        def spy(summer, round_idx, contributions, **kwargs):
            result = call(summer, round_idx, contributions, **kwargs)
            if result.total is not None:
                ids = np.asarray(contributions.clients)[result.contributors]
                self.releases.append((round_idx, ids, result.total.double().numpy()))
            return result

        return spy

    def noise_stds(self, dim: int) -> list[float]:
        """Per release: the std of (released sum - exact sum of the contributors' clipped vectors) over the update."""
        out = []
        for round_idx, ids, total in self.releases:
            exact = np.sum([self.vectors[(round_idx, c)] for c in ids.tolist()], axis=0)
            out.append(float(np.std(total[:dim] - exact[:dim])))
        return out


VICTIM_NODE = FIRST_NODE_ID  # shard 0


def victim_alone(monkeypatch, grid, victim: int, shared_of) -> dict:
    """The oracle attacks' malicious server: every round it samples ``victim`` alone on its node (shard 0) beside
    the other nodes' sampled users, and sends the shared vector ``shared_of(trainer, upto)`` (round upto + 1's);
    returns round -> the reply Message to the victim's node's train message, filled in as the server runs."""
    from fedrecgel_secure.deploy.server.remote import RemoteTrainer

    sample, common = RemoteTrainer.client_updates, RemoteTrainer._common

    def the_victim_alone_on_its_node(trainer, clients):  # the server's own sample, which no one can check
        return sample(trainer, np.union1d(clients[trainer.shard[clients] != 0], [victim]).astype(clients.dtype))

    def crafted(trainer, upto):
        return {**common(trainer, upto), "shared": shared_of(trainer, upto)}

    monkeypatch.setattr(RemoteTrainer, "client_updates", the_victim_alone_on_its_node)
    monkeypatch.setattr(RemoteTrainer, "_common", crafted)
    replies: dict[int, object] = {}
    to_victim: dict[str, int] = {}  # message id -> round, of the train messages to the victim's node
    push, pull = grid.push_messages, grid.pull_messages

    def sent(messages):
        messages = list(messages)
        ids = push(messages)
        for mid, m in zip(ids, messages):
            if m.metadata.message_type == "train" and m.metadata.dst_node_id == VICTIM_NODE:
                to_victim[mid] = int(m.metadata.group_id.split("-")[1])
        return ids

    def keep(ids):
        got = pull(ids)
        for m in got:
            r = to_victim.get(m.metadata.reply_to_message_id)
            if r is not None:
                replies[r] = m
        return got

    grid.push_messages, grid.pull_messages = sent, keep
    return replies


class PerNodeModels(TamperingGrid):
    """The server's transport: every train message but the victim node's carries an all-zero model."""

    def push_messages(self, messages):
        from fedrecgel_secure.deploy.wire import from_record, to_record

        messages = list(messages)
        for msg in messages:
            if msg.metadata.group_id.startswith("round-") and msg.metadata.dst_node_id != VICTIM_NODE:
                payload = from_record(msg.content)
                payload["shared"] = np.zeros_like(payload["shared"])
                msg.content = to_record(payload)
        return super().push_messages(messages)


def standalone_adverts(driver, round_idx: int, cohort) -> dict[int, dict]:
    """The malicious server's own attempt with no train stage: it signs an announcement of ``round_idx`` and sends
    it to the nodes in an advertise stage of its own (the honest server sends it only inside a train message, and
    its driver has no such stage); the nodes' replies, to run the rest of the protocol on
    (``driver.run_round(round_idx, cohort, adverts=...)``)."""
    from fedrecgel_secure.deploy.messages import request

    announcement = driver.begin(round_idx)
    users_of = {}
    for u in cohort:
        users_of.setdefault(driver.nodes.node_of[int(u)], []).append(int(u))
    payloads = {n: request("advertise", dict.fromkeys(us, b""), announcement) for n, us in users_of.items()}
    return driver.exchange("advertise", payloads)


# [deployment]: the node's bound on shared values lifted (the extra TOML of write_deploy_policy lands in that
# section when it comes first), for the attacks on other channels whose crafted models exceed it (B below)
UNBOUNDED = "max_shared_value = 1e38\n"

B = 2.0**16  # the logit offset: a positive's BCE is B + w_i, exactly, in float32


PER_ROUND = 16  # items probed a round, w_i = 2^0 .. 2^15 (their sum stays below B)


def crafted_model(policy, n_items: int, batch: np.ndarray) -> np.ndarray:
    """The shared vector whose logit for item ``batch[k]`` is -(B + 2^k) and for any other item -B, for every user."""
    import torch
    from torch.nn.utils import parameters_to_vector

    from fedrecgel_secure.federation.build import init_model

    model, _ = init_model(policy, n_items)
    gmf = model.gmf_dim
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.item_embeddings[torch.from_numpy(batch), gmf] = torch.tensor(
            [2.0**k for k in range(batch.size)], dtype=model.item_embeddings.dtype
        )
        model.mlp[0].weight[0, model.mlp_dim] = 1.0  # the first hidden unit reads the item's w_i, no user part
        model.mlp[2].weight[0, 0] = 1.0
        model.predict.weight[0, gmf] = -1.0
        model.predict.bias.fill_(-B)
    return parameters_to_vector(model.parameters()).detach().numpy()
