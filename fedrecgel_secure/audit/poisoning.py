"""Item promotion by fake clients inside the DPF scheme's secure sum, and what the norm check leaves of it (issue 50;
docs/privacy/input-checks.md).

Threat model: malicious clients (fake users in the directory, as many as the attack asks for) that know the global
model, a target item and the most popular item, and take part in every round (the worst case: a deployment's node
that draws its own users could always include them); they see no honest upload. Each sends the update that pushes
the target's item row along the signs of the popular item's row, every round: the server's Adam step then moves
the target's row by about its learning rate a round along them, so the target scores high wherever the popular
item does. The honest clients train as the policy says. The servers follow the protocol.

Three attackers: ``unbounded`` with the check off (today's code without it: any values enter the sum);
``unbounded`` with the check on (its upload, with the best proof a cheating client can make, :class:`CheatingProof`,
is dropped by both servers); ``bounded``: the same direction scaled to the bound, the best a malicious client can do
with the check on. The fakes' uploads go through a real DPF session (both servers, the check where it is on) and
what it releases is added to the honest clients' sum, which the simulator computes in arithmetic mode (the same
bits as the protocol's, ``tests/secagg/test_secagg_arithmetic.py``).

Measured: the target's share of the honest users' top-10 lists (over the items each has not interacted with) and
the model's HR@10.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch

from fedrecgel_secure.privacy.secagg import make_session
from fedrecgel_secure.privacy.secagg.dpf import wire
from fedrecgel_secure.privacy.secagg.dpf.norm import NormCheck
from fedrecgel_secure.privacy.secagg.dpf.sparse import KeyArrays, encode_placed
from fedrecgel_secure.privacy.secagg.proofs import goldilocks as g
from fedrecgel_secure.privacy.secagg.proofs import pine_fast
from fedrecgel_secure.privacy.secagg.proofs.field import FIELD64

FILLERS = 3  # honest clients of zero updates beside the fakes, so the fakes' session meets its min_clients
UNBOUNDED = 1e3  # the unbounded attacker's value a coordinate: its norm is about 1.3e4 on a row of 160


class CheatingProof(NormCheck):
    """A client's best proof for a vector over the bound: the norm and each wraparound test as the field computes
    them, clamped into the range the bits can hold (a false one fails the linear test), the norm's bits
    where they fit (else the bound's), and an honest proof of that encoding."""

    def prove(self, x, c1, seeds):
        check, f = self.check, FIELD64
        elements = g.from_signed(x)
        field_norm = int(g.total(g.mul(elements, elements)))
        v = field_norm if field_norm <= check.sq_bound else check.sq_bound
        results = g.to_signed(pine_fast.wraparound_dots(c1, check.tests, elements))
        tests = []
        for r in results.tolist():
            r = min(max(r, -check.wr_bound + 1), check.wr_bound)
            tests += f.bits(r + check.wr_bound - 1, check.wr_bits)
        bits = g.array(f.bits(v, check.sq_bits) + f.bits(check.sq_bound - v, check.sq_bits) + tests)
        meas = np.concatenate([elements, bits])
        bits_share = g.sub(bits, wire.pad(seeds[:16], self.bits_len, np.uint64))
        blind = bytes(16)
        h_bits = self.blinded(blind, bits_share)
        wire_seeds = g.array(range(1, check.gadget.arity + 1))
        proof = pine_fast.prove(check, meas, g.from_signed(results), wire_seeds, self.joint_rand(c1, h_bits))
        proof_share = g.sub(proof, wire.pad(seeds[16:], self.proof_len, np.uint64))
        return bits_share.astype("<u8").tobytes() + proof_share.astype("<u8").tobytes() + blind, h_bits


def forged_upload(client, round_idx: int, rows: Mapping[int, np.ndarray], dense: np.ndarray) -> bytes:
    """An upload of grid integers of the client's choosing, not clipped (its table ``rows``, row -> integers, and
    its ``dense`` integers), with :class:`CheatingProof`'s proof where the session checks norms."""
    p = client.params
    if client.norm is not None:
        client.norm = CheatingProof(client.norm.check, client.norm.buckets, client.norm.width)
    placed = p.layout.place(sorted(rows))
    keys0, keys1 = encode_placed(p.layout, placed, {b: g.from_signed(rows[r]) for b, r in placed.items()})
    buckets = np.zeros((p.layout.buckets, p.width), dtype=np.int64)
    for b, r in placed.items():
        buckets[b] = rows[r]
    checked = np.concatenate([buckets.reshape(-1), dense])
    return client.pack(round_idx, KeyArrays.of(keys0), KeyArrays.of(keys1), g.from_signed(dense), None, checked)


def promotion_row(model, target: int, popular: int, norm: float | None) -> np.ndarray:
    """The fakes' gradient for the target's row: minus the popular row's signs (so the step adds them), each
    :data:`UNBOUNDED`, or scaled to L2 ``norm``."""
    signs = torch.sign(model.item_embeddings.detach()[popular]).double().numpy()
    row = -signs * UNBOUNDED
    return row if norm is None else row / np.linalg.norm(row) * norm


class PoisonedSum:
    """A simulator's secure sum (arithmetic mode) with ``fakes`` fake clients added every round through a real DPF
    session over the covered vector: the check on (``checked``) or off; ``norm``: the attacker's L2 norm (None:
    unbounded). ``accepted`` counts the fakes' uploads the servers summed."""

    def __init__(self, inner, model, *, fakes: int, target: int, popular: int, checked: bool, norm: float | None):
        self.inner, self.model, self.target, self.popular, self.norm = inner, model, target, popular, norm
        params = inner.params if checked else dataclasses.replace(inner.params, norm_bound=0.0)
        self.fakes = list(range(fakes))
        self.session = make_session(
            "dpf",
            inner.covered,
            range(fakes + FILLERS),
            min_clients=1,
            params=params,
            encoding=inner.grid,
        )
        self.accepted = 0
        self.rounds = 0

    def __getattr__(self, name):  # the inner summer's parameters and grid, for whoever reads them
        return getattr(self.inner, name)

    def __call__(self, round_idx, contributions, *, central_noise=None, admit=None):
        result = self.inner(round_idx, contributions, central_noise=central_noise, admit=admit)
        if result.total is None:
            return result
        grid, width = self.inner.grid, self.inner.params.width
        norm = None if self.norm is None else grid.dp_clip(self.norm, width)  # rounded, still within the bound
        row = np.rint(promotion_row(self.model, self.target, self.popular, norm) * grid.scale).astype(np.int64)
        dense = np.zeros(self.inner.covered - self.inner.params.table_values, dtype=np.int64)
        zeros = {c: np.zeros(self.inner.covered) for c in self.session.clients}
        forged = {
            f: forged_upload(self.session.clients[f], round_idx, {self.target: row[:width]}, dense) for f in self.fakes
        }
        released = self.session.run_round(round_idx, zeros, intercept=lambda c, payload: forged.get(c, payload))
        self.accepted += sum(1 for f in self.fakes if f in released.contributors)
        self.rounds += 1
        total = result.total.clone()
        total[: self.inner.covered] += torch.from_numpy(released.total).to(total.dtype)
        return dataclasses.replace(result, total=total)


def top_share(model, theta: torch.Tensor, split, item: int, k: int = 10) -> float:
    """The share of users whose top-``k`` list (over the items they have not interacted with) holds ``item``."""
    from fedrecgel_secure.federation.evaluation import _seen_mask

    hits, step = 0, 256
    items = torch.arange(split.n_items)
    with torch.no_grad():
        for start in range(0, split.n_users, step):
            block = torch.arange(start, min(start + step, split.n_users))
            scores = model.score_candidates(theta[block], items.expand(block.numel(), -1)).cpu()
            scores = scores.masked_fill(_seen_mask(split, block), float("-inf"))
            hits += int((scores.topk(k, dim=1).indices == item).any(dim=1).sum())
    return hits / split.n_users


ATTACKERS = {  # name -> (the check on, the attacker's norm: None unbounded, "bound" the check's bound)
    "none": None,
    "unbounded, no check": (False, None),
    "unbounded, check": (True, None),
    "within the bound, check": (True, "bound"),
}


def attack_policy(rounds: int, model: dict | None = None, evaluate_every: int = 1):
    """The setting of the attack's measurements: FilmTrust, DPF with central DP (C = 0.5, z = 1, q = 0.1, seeded
    noise, so every run draws the same noise), server_lr 0.01, the honest clients in arithmetic simulation;
    ``model``: the [model] section (the default NeuMF when None); ``evaluate_every``: evaluation.every."""
    from fedrecgel_secure.policy import Policy

    return Policy.model_validate(
        {
            "data": {"dataset": "filmtrust", "protocol": "clean"},
            **({"model": model} if model else {}),
            "federation": {"rounds": rounds, "fraction": 0.1, "server_lr": 0.01},
            "evaluation": {"every": evaluate_every},
            "privacy": {
                "dp": {
                    "enabled": True,
                    "mode": "central",
                    "clip_norm": 0.5,
                    "noise_multiplier": 1.0,
                    "noise": "seeded",
                },
                "secure_aggregation": {
                    "scheme": "dpf",
                    "simulation": "arithmetic",
                    "min_clients": 10,
                    "cover": "shared",
                    "dpf": {"budget": 128},
                },
            },
        }
    )


def popularity(split) -> np.ndarray:
    """Each item's training interactions."""
    return np.bincount(split.train_items, minlength=split.n_items)


def attack(policy, split, attacker: str, fakes: int = 1, target: int | None = None) -> dict:
    """Train under ``policy`` (DPF with DP, arithmetic simulation) with ``fakes`` fake clients of ``attacker``
    (:data:`ATTACKERS`) promoting ``target`` (default: the median item by popularity) along the most popular item:
    the target's top-10 share and HR@10 at the end, the popular item's share, and the fakes' uploads summed."""
    from fedrecgel_secure.federation.trainer import Trainer

    counts = popularity(split)
    popular = int(counts.argmax())
    target = int(np.argsort(counts, kind="stable")[len(counts) // 2]) if target is None else target
    trainer = Trainer(policy, split)
    summer = None
    if ATTACKERS[attacker] is not None:
        checked, norm = ATTACKERS[attacker]
        inner = trainer.aggregation.summer
        bound = inner.params.norm_bound if norm == "bound" else None
        summer = PoisonedSum(
            inner, trainer.model, fakes=fakes, target=target, popular=popular, checked=checked, norm=bound
        )
        trainer.aggregation.summer = summer
    trainer.run(None)
    theta = trainer.states.theta
    return {
        "attacker": attacker,
        "fakes": fakes if summer is not None else 0,
        "target": target,
        "target_share": top_share(trainer.model, theta, split, target),
        "popular_share": top_share(trainer.model, theta, split, popular),
        "hr@10": trainer.history[-1].get("hr@10"),
        "accepted": 0 if summer is None else summer.accepted,
        "fake_uploads": 0 if summer is None else fakes * summer.rounds,
        "model": [p.detach().clone() for p in trainer.model.parameters()],
    }
