"""Evaluation inside the round's sum (``evaluation.scope = "round"``): the metrics ride in the uploads.

Under ``scope = "all"`` every user is evaluated on each evaluated model and the
means are exact: the simulator's research measure, and a deployment's where
nothing protects the uploads. But a deployment's node that evaluates whatever
model it is sent and returns its users' summed HR and NDCG is an oracle: a server
that crafts the model reads which items a node's users hold out
(tests/attacks/test_deploy_evaluation_oracle.py). Under ``scope = "round"``:

* the users sampled for round R evaluate the model they were sent for it (round
  R-1's result, the one they sign), with their private state before they train,
  which is the state the plain evaluation of round R-1 uses;
* each appends its HR@K and NDCG@K (K: ``evaluation.select_by``'s cut-off; test,
  and validation when the split has it) to its upload as :data:`extra <Uploads.reports>`
  coordinates, each clamped to [0, 1], so they are summed by the same secure sum as
  the update and reach the server only as the round's sum over its contributors;
* under DP they get noise of their own, sized so that the round is still one
  Gaussian mechanism of noise multiplier z (:func:`.resolution.validate_against_population`
  spends the share ``privacy.dp.evaluation_share`` of 1/z^2 on them), so the budget
  is charged once and nothing else is spent.

So at most one evaluation per round leaves, for the model that round's users signed, inside
the sum, and the metrics are means over the round's contributors, not over everyone: a noisy
estimate (under DP, noisy by design), marked ``evaluated_by = "round"`` in every record. The
last round's model has no later round to evaluate it: its record has no metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:  # torch only where reports are made: the policy checks (deploy plan) load no training stack
    import torch

    from fedrecgel_secure.federation.summers import Contributions

Scope = Literal["all", "round"]
ROUND = "round"


def protects_uploads(policy) -> bool:
    """Whether anything limits what the server learns from the uploads: secure aggregation or DP."""
    from fedrecgel_secure.privacy.secagg.schemes import scheme_of

    return scheme_of(policy.privacy.secure_aggregation).sealed or policy.privacy.dp.enabled


def scope_of(policy, deployed: bool = False) -> Scope:
    """Where the metrics come from: ``evaluation.scope``, or when unset, the round's users in a deployment that
    protects its uploads and every user otherwise. (A protected deployment refuses an explicit "all":
    :func:`fedrecgel_secure.deploy.check_deployable`.)

    The one place the scope is resolved: a run resolves it where it is built (the trainer, a deployment's
    node or key holder) and hands the scope, not whether it is deployed, to what it builds."""
    scope = policy.evaluation.scope
    if scope is not None:
        return scope
    return ROUND if deployed and protects_uploads(policy) else "all"


def report_keys(policy) -> list[str]:
    """The metrics each user reports under scope "round", in coordinate order (:meth:`Policy.report_keys`)."""
    return policy.report_keys()


def report_count(policy, scope: Scope) -> int:
    """How many metrics each upload carries inside the sum under ``scope`` (:func:`scope_of`): none unless
    "round"."""
    return len(report_keys(policy)) if scope == ROUND else 0


def user_reports(model, theta: torch.Tensor, split, users: np.ndarray, policy) -> torch.Tensor:
    """(len(users), len(report_keys)) float64: each user's metrics on ``model``, its private rows ``theta``
    (one per user, in order) and its candidates in ``split`` (rows ``users`` of the split held here)."""
    import torch

    from fedrecgel_secure.federation.evaluation import batched_scores
    from fedrecgel_secure.metrics import ranking_values

    k = int(policy.evaluation.select_by.split("@")[1])
    which = ["test"] + (["val"] if policy.data.validation else [])
    cols = []
    with torch.no_grad():
        for w in which:
            candidates = torch.from_numpy(split.candidates(w)[users]).to(theta.device)
            cols.append(ranking_values(batched_scores(model, theta, candidates), (k,)))
    return torch.cat(cols, dim=1).cpu()


def zero_reports(n: int, policy) -> torch.Tensor:
    """What a round's users report when no model of theirs is due for evaluation: zeros, summed like any report."""
    import torch

    return torch.zeros(n, len(report_keys(policy)), dtype=torch.float64)


def with_reports(contributions: Contributions, reports: torch.Tensor | None) -> Contributions:
    """``contributions`` with each client's reports appended (clamped to [0, 1], so each adds at most
    sqrt(len(keys)) to the sum whatever a client sends), the fast sums kept. No noise is added here:
    :class:`~.dp_aggregation.DPMechanism` sizes and draws the reports' noise with the update's."""
    import torch

    from fedrecgel_secure.federation.summers import Contributions

    if reports is None:
        return contributions
    reports = reports.to(torch.float64).clamp(0.0, 1.0)
    base, extra = contributions.dim, reports.shape[1]

    def vector(pos: int) -> torch.Tensor:
        v = contributions.vector(pos)
        return torch.cat([v, reports[pos].to(v.dtype, copy=False).to(v.device)])

    total = None
    if contributions.total is not None:

        def total() -> torch.Tensor:
            t = contributions.total()
            return torch.cat([t, reports.sum(0).to(t.dtype).to(t.device)])

    grid_total, dtype = None, contributions.vector_dtype
    if contributions.grid_total is not None and dtype is not None:

        def grid_total(grid, positions: np.ndarray, stop: int):
            if stop <= base:
                return contributions.grid_total(grid, positions, stop)
            fast = contributions.grid_total(grid, positions, base)
            if fast is None:
                return None
            # cast as vector() casts them: a client encodes its reports in its vector's dtype
            ints, over = grid.encode(reports[positions][:, : stop - base].to(dtype).double().numpy())
            return np.concatenate([fast[0], ints.sum(axis=0)]), fast[1] + over

    add_grid_values = None
    if contributions.add_grid_values is not None and dtype is not None:

        def add_grid_values(grid, positions: np.ndarray, g: torch.Tensor) -> None:
            contributions.add_grid_values(grid, positions, g)
            picked = reports[torch.as_tensor(positions)].to(dtype)  # cast as vector() casts them
            g[:, base : base + extra] += torch.round(picked.to(torch.float64) * grid.scale)

    return Contributions(
        contributions.clients,
        base + extra,
        contributions.dtype,
        vector,
        contributions.noise,
        total,
        grid_total,
        contributions.noises,
        add_grid_values,
        dtype,
        contributions.summed_noise,
    )


def metrics_of(sums: torch.Tensor, contributors: float, policy) -> dict[str, float]:
    """A round's released report sums as metrics: means over the round's contributors (under DP, noisy; under
    hidden participation over their expected number, :meth:`~.dp_aggregation.DPFedAvg._reporters`)."""
    keys = report_keys(policy)
    values = sums.double().tolist()
    return {
        **{k: v / max(1, contributors) for k, v in zip(keys, values, strict=True)},
        "evaluated_by": ROUND,
        "eval_users": round(contributors),
    }
