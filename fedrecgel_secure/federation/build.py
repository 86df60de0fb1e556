"""The parts of a run built from its policy: aggregation rule, DP mechanism, initial model, negatives, engine.

Concern: construction only, with no round loop. One home for each build, so that the simulator's
:class:`~fedrecgel_secure.federation.trainer.Trainer` and every deployment's node (:mod:`fedrecgel_secure.deploy`)
make the same model from the same seed, draw the same examples per client and clip and noise alike.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedrecgel_secure.data.split import SeenIndex, Split
from fedrecgel_secure.federation.aggregation import AggregationRule, MeanAggregation
from fedrecgel_secure.federation.dp_aggregation import DPFedAvg
from fedrecgel_secure.federation.dp_mechanism import DPMechanism
from fedrecgel_secure.federation.negatives import build_local_sets_per_client
from fedrecgel_secure.federation.per_client import ClientConfig, PerClientEngine
from fedrecgel_secure.federation.reports import Scope, report_count
from fedrecgel_secure.federation.summers import Summer
from fedrecgel_secure.model import NeuMF
from fedrecgel_secure.policy import Policy
from fedrecgel_secure.privacy.secagg.settings import encoding


def make_aggregation(
    policy: Policy, n_users: int, model: NeuMF, summer: Callable[[int], Summer], scope: Scope
) -> AggregationRule:
    """The policy's aggregation rule with the summer ``summer(dim)`` of ``dim``-long uploads
    (:meth:`~fedrecgel_secure.federation.trainer.Trainer.make_summer`); under DP, with a fresh CSPRNG secret unless
    the policy asks for seeded noise. ``scope``: where the metrics come from, as the run resolved it
    (:func:`~fedrecgel_secure.federation.reports.scope_of`)."""
    dim = sum(p.numel() for p in model.parameters())
    settings = policy.privacy.dp
    if not settings.enabled:
        rule = MeanAggregation(policy.federation.fraction, None, report_count(policy, scope))
    else:
        rule = make_dp_rule(policy, n_users, scope)
    rule.summer = summer(dim + rule.extra)
    return _with_canaries(policy, rule, dim)


def make_dp_rule(policy: Policy, n_users: int, scope: Scope) -> DPFedAvg:
    """The policy's DP-FedAvg, with no summer yet. Its randomness is a fresh CSPRNG secret unless the policy asks
    for seeded noise."""
    return DPFedAvg(make_dp_mechanism(policy, n_users, scope), nodes=node_users(policy, n_users))


def node_users(policy: Policy, n_users: int) -> list[np.ndarray]:
    """Each deployment node's user ids (``deployment``'s sharding): the groups hidden participation draws in
    (:mod:`fedrecgel_secure.privacy.dp.hidden`), in a simulation as in the deployment it stands for."""
    d = policy.deployment
    return [d.shard_users(n_users, s) for s in range(d.nodes)]


def make_dp_mechanism(policy: Policy, n_users: int, scope: Scope) -> DPMechanism:
    """The policy's DP clipping and noise over ``n_users`` clients under evaluation ``scope``, without an
    accountant: what a deployment's node (its users' part) and the BFV key holder (the central noise) run, with the
    deployment's scope. Its randomness is a fresh CSPRNG secret unless the policy asks for seeded noise."""
    from fedrecgel_secure.privacy.dp.randomness import DPRandomness

    seeded = policy.privacy.dp.noise == "seeded"
    randomness = DPRandomness.from_seed(policy.seed) if seeded else DPRandomness.fresh()
    return DPMechanism(resolve_dp(policy, n_users, scope), encoding(policy.privacy.secure_aggregation), randomness)


def resolve_dp(policy: Policy, n_users: int, scope: Scope):
    """The policy's DP settings over ``n_users`` clients, z calibrated (:func:`validate_against_population`), with
    the reports evaluation ``scope`` puts in the uploads: what the mechanism runs and what ``fedrecgel policy show``
    plans."""
    from fedrecgel_secure.privacy.dp.resolution import validate_against_population

    return validate_against_population(
        policy.privacy.dp,
        n_users,
        policy.federation.rounds,
        policy.federation.fraction,
        policy.privacy.secure_aggregation,
        reports=report_count(policy, scope),
    )


def _with_canaries(policy: Policy, rule, dim: int):
    """Attach the audit canaries of ``[privacy.audit]`` (docs: README, "The privacy audit"), if any."""
    if policy.privacy.audit.canaries:
        from fedrecgel_secure.audit.canaries import make_canaries

        rule.canaries = make_canaries(policy, rule, dim)
    return rule


def init_model(policy: Policy, n_items: int) -> tuple[NeuMF, torch.Generator]:
    """The shared model's initial parameters, and the generator that draws the private embeddings next
    (``model.init_private(n_users, init)``): the same draws for the simulator and every deployment's node."""
    init = torch.Generator().manual_seed(policy.seed)
    model = NeuMF(n_items, policy.model.gmf_dim, policy.model.mlp_dim, tuple(policy.model.tower))
    model = model.to(getattr(torch, policy.model.dtype))
    model.reset_parameters(init)
    return model, init


def negatives_index(policy: Policy, split: Split) -> SeenIndex:
    """What a training negative may not be. The authors draw outside the training set only, so the held-out
    test item can be drawn as a negative; the clean protocol excludes every item the user interacted with, so the
    test item never becomes a training label."""
    if policy.data.protocol == "authors":
        return SeenIndex(split.train_indptr, split.train_items, split.n_items)
    return SeenIndex(split.seen_indptr, split.seen_items, split.n_items)


def local_sets(
    policy: Policy,
    split: Split,
    seen: SeenIndex,
    clients: np.ndarray,
    round_idx: int,
    users: np.ndarray | None = None,
):
    """The clients' examples for round ``round_idx``, under the policy's data protocol, each from its own stream
    (:func:`~fedrecgel_secure.federation.negatives.client_rng`), so that no client's draws depend on who
    else is sampled or where it is trained. ``clients`` are rows of ``split``; ``users`` their user indices
    when ``split`` is a node's shard (default: the rows themselves)."""
    return build_local_sets_per_client(
        policy.seed,
        round_idx,
        split,
        seen,
        clients,
        policy.data.train_negatives,
        blocks=policy.data.protocol == "authors",
        streams=users,
    )


def make_engine(policy: Policy):
    rho_sh, rho_ns = policy.rhos()
    cfg = ClientConfig(
        rho_sh=rho_sh, rho_ns=rho_ns, client_lr=policy.federation.client_lr, chunk_size=policy.federation.chunk_size
    )
    if policy.federation.engine == "per-client":
        return PerClientEngine(cfg)
    from fedrecgel_secure.federation.batched import BatchedEngine

    return BatchedEngine(cfg, clients_per_batch=policy.federation.clients_per_batch)
