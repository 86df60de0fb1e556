"""Auditing a run: every attack on every view the server has, and the empirical ε where canaries were inserted.

:func:`audit_rounds` attacks fresh rounds of a trainer's current model without
changing the trainer; :func:`audit_run` does that for a run directory, adds the
canary estimate (:mod:`.estimate`) and writes ``audit.json`` once, atomically.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedrecgel_secure.audit.attacks import ATTACKS, CLIENT_FREE, Context
from fedrecgel_secure.audit.metrics import popularity_prior, success
from fedrecgel_secure.audit.views import RoundViews, available, server_view
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation.server import Server
from fedrecgel_secure.runs.directory import AUDIT, atomic_write_json
from fedrecgel_secure.tracking import log_file


def _best(attacks: dict) -> str:
    return max(attacks, key=lambda a: (attacks[a]["auc"], attacks[a]["precision_at_k"]))


def _audited_views(policy, views: list[str] | None) -> tuple[str, list[str]]:
    """The server's view under ``policy`` and the views to attack (``views``, or that one and ``released``)."""
    if policy.privacy.dp.enabled and policy.privacy.dp.simulate_shares == "summed":
        raise BadInputError(
            "privacy.dp.simulate_shares = 'summed': the audit attacks each client's noised upload, which the study"
            " mode never draws (the shares come as one sum); audit a run with simulate_shares = 'per_client'"
        )
    primary = server_view(policy)
    views = list(views) if views is not None else [primary, "released"]
    for view in views:
        if not available(policy, view):
            raise ValueError(f"view {view!r} does not exist under this policy's DP settings")
    return primary, views


def _attack_client(rv, pos, released, ctx, positives, scores, cached, *, views, attacks, imia_clients) -> None:
    """Every attack on every view of the round's ``pos``-th client, each success appended to ``scores``.

    ``cached`` holds the scores of attacks that read a shared view (the sum, the released step) but not the client,
    computed once per round for all its clients."""
    for view in views:
        shared = view == "released" or rv.shared(view)
        table = None
        for attack in attacks:
            if attack == "imia" and not shared and pos >= imia_clients:
                continue
            key = (view, attack)
            if shared and attack in CLIENT_FREE and key in cached:
                s = cached[key]
            else:
                if table is None:
                    table = released if view == "released" else rv.table(view, pos)
                s = ATTACKS[attack](table, ctx)
                if shared and attack in CLIENT_FREE:
                    cached[key] = s
            scores[view][attack].append(success(s, positives))


def _summary(
    scores: dict, views: list[str], primary: str, rounds: int, clients_seen: int, prior_scores, chance
) -> dict:
    """The audit's report: each view's mean scores per attack and best attack, headed by the server's view."""
    per_view = {}
    for view in views:
        table = {
            a: {
                "auc": float(np.mean([s[0] for s in v])),
                "precision_at_k": float(np.mean([s[1] for s in v])),
                "clients": len(v),
            }
            for a, v in scores[view].items()
            if v
        }
        per_view[view] = {"attacks": table, "best": _best(table)}
    prior_auc, prior_p = (float(x) for x in np.mean(prior_scores, axis=0))
    head_view = primary if primary in per_view else views[0]
    best = per_view[head_view]["attacks"][per_view[head_view]["best"]]
    out = {
        "view": head_view,
        "clients": clients_seen,
        "rounds": rounds,
        "views": per_view,
        "best_attack": per_view[head_view]["best"],
        "attack_auc": best["auc"],
        "attack_precision_at_k": best["precision_at_k"],
        "chance_auc": 0.5,
        "chance_precision_at_k": float(np.mean(chance)),
        "prior_auc": prior_auc,
        "prior_precision_at_k": prior_p,
    }
    if "released" in per_view:
        r = per_view["released"]["attacks"][per_view["released"]["best"]]
        out.update(released_auc=r["auc"], released_precision_at_k=r["precision_at_k"])
    return out


def audit_rounds(
    trainer,
    rounds: int = 3,
    *,
    views: list[str] | None = None,
    attacks: list[str] | None = None,
    imia_clients: int = 8,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> dict:
    """Attack ``rounds`` fresh rounds of a trainer's current model with every attack on every view.

    ``views`` defaults to the server's view under the policy plus ``released``.
    The rounds are the trainer's next round indices and run on copies of the
    model, server optimiser and client states (the released model moves from
    round to round); the trainer's RNG and aggregation state are restored, so
    auditing a run does not change it. IMIA, the costly attack, is run on the
    first ``imia_clients`` clients of each round on individual views.
    ``on_progress(round, clients attacked, clients of the round)`` hears of each client attacked (round from 1).
    """
    policy, split = trainer.policy, trainer.split
    primary, views = _audited_views(policy, views)
    attacks = list(attacks) if attacks is not None else list(ATTACKS)
    rng_state = trainer.rng.bit_generator.state
    agg = trainer.aggregation
    agg_state = copy.deepcopy(agg.state_dict())
    model = copy.deepcopy(trainer.model)
    server = Server(model, policy.federation.server_lr, policy.federation.server_optimizer)
    server.optimizer.load_state_dict(copy.deepcopy(trainer.server.optimizer.state_dict()))
    states = copy.deepcopy(trainer.states)
    n_items, row_dim = model.item_embeddings.shape
    dim = sum(p.numel() for p in model.parameters())
    dtype = model.item_embeddings.dtype
    item_counts = np.bincount(split.train_items, minlength=split.n_items)
    scores: dict[str, dict[str, list[tuple[float, float]]]] = {v: {a: [] for a in attacks} for v in views}
    prior_scores, chance, clients_seen = [], [], 0
    try:
        for round_idx in range(trainer.round + 1, trainer.round + 1 + rounds):
            clients = agg.sample(round_idx, trainer.rng, split.n_users)
            if clients.size == 0:
                continue
            local = trainer.local_sets(clients, round_idx)
            update = trainer.engine.train_round(model, states, local)
            rv = RoundViews(agg, round_idx, clients, update.uploads, dim, dtype, n_items, row_dim)
            before = model.item_embeddings.detach().double().clone()
            round_model = copy.deepcopy(model) if "released" in views else model
            if "released" in views:
                server.step(rv.released_gradient())
                states.commit(update.private.select(torch.arange(clients.size)))
            released = None if "released" not in views else before - model.item_embeddings.detach().double()
            cached: dict[tuple[str, str], np.ndarray] = {}
            for pos, client in enumerate(clients):
                own = split.train_items[split.train_indptr[client] : split.train_indptr[client + 1]]
                positives = np.zeros(split.n_items, dtype=bool)
                positives[own] = True
                prior = popularity_prior(item_counts, own)
                prior_scores.append(success(prior, positives))
                chance.append(positives.sum() / split.n_items)
                clients_seen += 1
                ctx = Context(prior, round_model, seed=round_idx)
                _attack_client(
                    rv,
                    pos,
                    released,
                    ctx,
                    positives,
                    scores,
                    cached,
                    views=views,
                    attacks=attacks,
                    imia_clients=imia_clients,
                )
                if on_progress is not None:
                    on_progress(round_idx - trainer.round, pos + 1, clients.size)
    finally:
        trainer.rng.bit_generator.state = rng_state
        agg.load_state_dict(agg_state)
    if not clients_seen:
        raise ValueError("no client was sampled in the audited rounds")
    return _summary(scores, views, primary, rounds, clients_seen, prior_scores, chance)


def canary_estimate(trainer, *, bootstrap: int = 200) -> dict | None:
    """The empirical ε of a run trained with canaries, beside the accounted ε; None without canaries."""
    from fedrecgel_secure.audit.estimate import estimate_epsilon, lower_bound_steinke

    canaries = getattr(trainer.aggregation, "canaries", None)
    if canaries is None:
        return None
    inserted, held_out = canaries.cosines()
    dp = getattr(trainer.aggregation, "dp", None)
    # the run's reported delta: the accountant's plus what the sampler's truncation added
    delta = trainer.aggregation.ledger.report()["delta"] if dp is not None else trainer.policy.privacy.dp.delta
    accounted = trainer.aggregation.accountant.epsilon() if dp is not None else math.inf
    est = estimate_epsilon(inserted, held_out, delta, bootstrap=bootstrap, seed=trainer.policy.seed)
    red_flag = bool(est["low"] > accounted)
    return {
        "canaries": canaries.k,
        "canary_norm": canaries.norm,
        "canary_rate": canaries.sample_rate,
        "canary_insertions": int(canaries.times_inserted.sum()),
        "rounds": canaries.rounds,
        "accounted_epsilon": accounted,
        "empirical_epsilon": est["epsilon"],
        "empirical_epsilon_low": est["low"],
        "empirical_epsilon_high": est["high"],
        "confidence": est["confidence"],
        "delta": delta,
        "fit": {k: est[k] for k in ("mu_inserted", "sigma_inserted", "mu_held_out", "sigma_held_out")},
        "capped": est["capped"],
        "empirical_epsilon_two_gaussians": est["epsilon_two_gaussians"],
        "lower_bound": lower_bound_steinke(inserted, held_out, delta),
        "red_flag": red_flag,
        "warning": (
            f"RED FLAG: the empirical epsilon ({est['epsilon']:.3g}, {est['confidence']:.0%} CI"
            f" {est['low']:.3g}-{est['high']:.3g}) exceeds the accounted epsilon ({accounted:.3g}):"
            " the noise or the accounting is broken"
            if red_flag
            else None
        ),
    }


def audit_run(run_dir: Path, rounds: int = 3, on_progress: Callable[[int, int, int], None] | None = None) -> dict:
    """Audit the model a run directory holds, and write ``RUN_DIR/audit.json``.

    The file is written once, atomically, after everything is computed: it is
    either absent or complete, so a crash never leaves a file that a study
    would take as a finished audit. ``on_progress``: as :func:`audit_rounds`'.
    """
    from fedrecgel_secure.federation.runner import restore_trainer

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BadInputError(f"rounds to audit: expected an integer >= 1, got {rounds!r}")
    trainer = restore_trainer(run_dir)
    result = {"round": trainer.round, **audit_rounds(trainer, rounds, on_progress=on_progress)}
    estimate = canary_estimate(trainer)
    if estimate is not None:
        result["canaries"] = estimate
        for key in (
            "accounted_epsilon",
            "empirical_epsilon",
            "empirical_epsilon_low",
            "empirical_epsilon_high",
            "red_flag",
        ):
            result[key] = estimate[key]
    atomic_write_json(Path(run_dir) / AUDIT, _json_safe(result))
    log_file(run_dir, AUDIT)  # to the run's experiment trackers, if it has any
    return result


def _json_safe(x):
    """inf as the string "inf": audit.json stays strict JSON."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return x
