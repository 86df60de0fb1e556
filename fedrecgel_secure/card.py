"""An export's model card: what a reader of the exported model must know, as JSON and as Markdown.

:func:`model_card` gathers the facts (where the model came from, how it scores, how good the exported weights are
and how that was measured, what privacy it has, what the export holds); :func:`card_markdown` writes the same facts
for people. The metrics headlined are those of the round whose weights are exported; the best round's, selected on
the test items by default (the authors' protocol), are stated beside them and named as such.
"""

from __future__ import annotations

from pathlib import Path

METRIC_KEYS = [f"{m}@{k}" for m in ("hr", "ndcg") for k in (5, 10, 15, 20)]
METHOD_CITATION = (
    "FedRecGEL: Generalisable Item Embeddings for federated recommendation. arXiv 2603.11503,"
    " The ACM Web Conference 2026. https://arxiv.org/abs/2603.11503"
)
LICENSE = "MIT"  # the package's (pyproject.toml); the data's own terms apply to what the weights learnt from it
INTENDED_USE = (
    "Top-K item recommendation for the dataset's users, and for new users folded in from a few of their items"
    " (fedrecgel recommend --items); research on federated recommendation under secure aggregation and DP."
)
LIMITATIONS = [
    "Trained on one dataset's implicit feedback: it recommends that catalogue only, and reflects its popularity"
    " biases; a new item has no embedding until the model is trained again.",
    "Metrics are sampled (one held-out item against sampled negatives), known to overstate differences between"
    " models (Krichene and Rendle, KDD 2020); the best round is selected on the test items by default.",
    "Client-level DP bounds what the shared model reveals about any one user's participation; it does not cover"
    " a user's own embedding, nor seen items, when they are exported.",
    "Scores are logits of an implicit-feedback model: a ranking signal, not calibrated probabilities.",
]
USAGE = """from fedrecgel_secure.serving import open_served

served = open_served("EXPORT_DIR")
print(served.recommend_new([["ITEM_ID", "ITEM_ID"]], k=10)[0])   # a new user, folded in from two items"""


def _privacy(summary) -> dict:
    p = summary.privacy
    if p is None:
        return {"dp": False, "guarantee": "none: trained without differential privacy"}
    return {
        "dp": True,
        "epsilon": {"release": p.epsilon, "server": p.epsilon_server},
        "delta": p.delta,
        "noise": p.noise,
        "seeded": p.noise == "seeded",
        "guarantee": p.guarantee,
        "mode": p.mode,
        "accountant": p.accountant,
        "sampler": p.sampler,
        "participation": p.participation,
        "noise_multiplier": p.noise_multiplier,
        "sample_rate": p.sample_rate,
        "clip_norm": p.clip_norm,
        "server_rounds": p.server_rounds,
    }


def _metrics(policy, summary, exported_round: int, records: list[dict]) -> dict:
    """The exported round's evaluation (None where that round was not evaluated), the best round's, and how both
    were measured."""
    from fedrecgel_secure.runs.directory import evaluated

    # a record without metrics is a round that was not evaluated: under evaluation scope "round" the last one's
    exported = next((r for r in evaluated(records, summary.select_by) if r.get("round") == exported_round), None)
    if exported is None and summary.final is not None and summary.final.get("round") == exported_round:
        exported = summary.final
    validation = policy.data.validation
    return {
        "exported_round": exported_round,
        "exported": exported,
        "best": summary.best,
        "select_by": summary.select_by,
        # the authors' protocol picks the best round on the test items themselves: optimistic, hence named
        "best_selected_on": "test items (the authors' protocol; optimistic)",
        "validation_selected": summary.validation_selected if validation else None,
        "protocol": (
            f"leave-one-out: each user's held-out item ranked against {policy.data.test_negatives} sampled items the"
            " user never interacted with; HR@K is the share of users whose held-out item is in the top K,"
            " NDCG@K its discounted gain 1/log2(rank + 1)"
        ),
    }


def model_card(
    run_dir: Path,
    policy,
    summary,
    architecture: dict,
    exported_round: int,
    records: list[dict],
    contents: dict,
    export_format: str,
) -> dict:
    """The card's facts. ``architecture``: :func:`fedrecgel_secure.model.architecture` of the exported weights;
    ``exported_round``: the checkpoint's round; ``records``: the run's ``metrics.jsonl``; ``contents``: the
    export's files by role (None: not exported)."""
    from fedrecgel_secure import __version__
    from fedrecgel_secure.tracking import WITHHELD, seeded_noise

    d = policy.data
    secagg = summary.secure_aggregation
    return {
        "format": export_format,
        "package": {"name": "fedrecgel-secure", "version": __version__},
        "run": str(run_dir),
        "method": summary.method,
        "model": {**architecture, "dtype": policy.model.dtype},
        "data": {
            "dataset": d.dataset,
            "protocol": d.protocol,
            "split": "leave-one-out (latest interaction held out for test"
            + (", second-latest for validation)" if d.validation else ")"),
            "min_interactions": d.min_interactions,
            "test_negatives": d.test_negatives,
            "seed": WITHHELD if seeded_noise(policy) else d.seed,
            **summary.data.model_dump(),
        },
        # under seeded noise a hash of the policy, whose only unknown is a small seed, gives the noise seed away
        "policy_digest": WITHHELD if seeded_noise(policy) else summary.policy_digest,
        "rounds": {"done": summary.rounds_done, "planned": summary.rounds_planned, "exported": exported_round},
        "metrics": _metrics(policy, summary, exported_round, records),
        "privacy": _privacy(summary),
        "secure_aggregation": "none" if secagg is None else secagg.describe(),
        "contents": contents,
        "usage": USAGE,
        "intended_use": INTENDED_USE,
        "limitations": LIMITATIONS,
        "license": LICENSE,
        "citation": {"method": METHOD_CITATION, "dataset": _dataset_citation(d.dataset)},
    }


def _dataset_citation(dataset: str) -> str:
    from fedrecgel_secure.data.datasets import DATASETS

    info = DATASETS.get(dataset)
    return info.citation if info is not None else f"{dataset}: a local file; cite its source"


def _metric_rows(metrics: dict) -> list[str]:
    exported, best = metrics["exported"] or {}, metrics["best"] or {}
    rows = ["| metric | exported weights | best round (selected on the test items) |", "| --- | ---: | ---: |"]
    rows.append(f"| round | {metrics['exported_round']} | {best.get('round', '-')} |")
    rows += [
        f"| {k.upper()} | {exported.get(k, float('nan')):.4f} | {best.get(k, float('nan')):.4f} |" for k in METRIC_KEYS
    ]
    return rows


def _metrics_lines(metrics: dict) -> list[str]:
    exported = metrics["exported"]
    headline = (
        f"The exported weights are round {metrics['exported_round']}'s: **HR@10 {exported['hr@10']:.4f},"
        f" NDCG@10 {exported['ndcg@10']:.4f}**."
        if exported
        else f"The exported weights are round {metrics['exported_round']}'s, which was not evaluated."
    )
    best = metrics["best"]
    beside = (
        ""
        if not best or best.get("round") == metrics["exported_round"]
        else f" The best round by {metrics['select_by']} was round {best['round']} (other weights, not exported)."
    )
    return [headline + beside, "", *_metric_rows(metrics), "", f"Measured by {metrics['protocol']}."]


def _privacy_lines(p: dict) -> list[str]:
    if not p["dp"]:
        return [f"- {p['guarantee']}"]
    server = "no bound (it sees the clipped uploads)" if p["epsilon"]["server"] is None else p["epsilon"]["server"]
    return [
        f"- client-level DP ({p['mode']} noise, {p['accountant']}, sampler {p['sampler']},"
        f" participation {p.get('participation', 'known')}):"
        f" ε = {p['epsilon']['release']} against anyone who sees the released models,"
        f" ε = {server} against the server; δ = {p['delta']}",
        f"- noise: **{p['noise']}**" + (" (SEEDED: research mode)" if p["seeded"] else ""),
        f"- guarantee: {p['guarantee']}",
    ]


def _architecture_lines(m: dict) -> list[str]:
    return [
        f"NeuMF: {m['n_items']:,} items, GMF dim {m['gmf_dim']}, MLP dim {m['mlp_dim']}, tower {m['tower']},"
        f" {m['activation']} after every tower layer, weights in {m['dtype']}.",
        "",
        f"- rows of `item_embeddings` and a user's row: [{' | '.join(m['embedding_halves'])}] halves",
        f"- the tower's input: [{' | '.join(m['mlp_input'])}]",
        f"- the prediction layer's input: [{' | '.join(m['predict_input'])}]; its output is a {m['output']}",
        f"- {m['formula']}",
    ]


def _front_matter(card: dict) -> list[str]:
    """YAML metadata, as model hubs read it: every value a JSON scalar, which YAML reads as written."""
    import json

    p, exported = card["privacy"], card["metrics"]["exported"] or {}
    meta = {
        "license": card["license"].lower(),
        "library_name": "fedrecgel-secure",
        "pipeline_tag": "recommendation",
        "datasets": [card["data"]["dataset"]],
        "tags": ["federated-learning", "recommendation", "neumf", card["method"]]
        + (["differential-privacy"] if p["dp"] else []),
        "metrics": {k: exported[k] for k in ("hr@10", "ndcg@10") if k in exported},
        "epsilon_release": p["epsilon"]["release"] if p["dp"] else None,
        "epsilon_server": p["epsilon"]["server"] if p["dp"] else None,
    }
    lines = ["---"]
    for key, value in meta.items():
        if isinstance(value, dict):
            lines += [f"{key}:", *[f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()]]
        elif isinstance(value, list):
            lines += [f"{key}:", *[f"- {json.dumps(v)}" for v in value]]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return [*lines, "---", ""]


def card_markdown(card: dict) -> str:
    """The model card as Markdown: the same facts as the JSON."""
    d, contents = card["data"], card["contents"]
    users = (
        f"`{contents['user_embeddings']}`: every user's private embedding (0600; not covered by DP)"
        if contents["user_embeddings"]
        else "**not included** (each user's private embedding stays in the run's checkpoint)"
    )
    seen = (
        f"`{contents['seen_items']}`: each user's training items (0600: the users' own interaction data, included"
        " on request so an app can leave them out of recommendations)"
        if contents.get("seen_items")
        else "**not included** (they are the users' own data; `--include-seen-items` exports them)"
    )
    lines = [
        *_front_matter(card),
        f"# Model card: {card['method']} on {d['dataset']}",
        "",
        f"Exported by fedrecgel-secure {card['package']['version']} from `{card['run']}`"
        f" (round {card['rounds']['exported']}; {card['rounds']['done']} of {card['rounds']['planned']} done).",
        "",
        "## Architecture",
        "",
        *_architecture_lines(card["model"]),
        "",
        "## Data",
        "",
        f"- dataset `{d['dataset']}`, protocol {d['protocol']}: {d['users']:,} users, {d['items']:,} items"
        + ("" if d.get("interactions") is None else f", {d['interactions']:,} interactions"),
        f"- split: {d['split']}; users with at least {d['min_interactions']} interactions,"
        f" {d['test_negatives']} test negatives, seed {d['seed']}",
        f"- policy digest: `{card['policy_digest']}`",
        "",
        "## Metrics",
        "",
        *_metrics_lines(card["metrics"]),
        "",
        "## Privacy",
        "",
        *_privacy_lines(card["privacy"]),
        f"- secure aggregation: {card['secure_aggregation']}",
        "",
        "## Contents",
        "",
        f"- `{contents['shared_model']}`: the shared model (item embeddings, MLP tower, prediction layer)",
        f"- item ids: `{contents['item_ids']}`" if contents["item_ids"] else "- item ids: indices 0 .. n-1",
        f"- user embeddings: {users}",
        f"- seen items: {seen}",
        "",
        "## Usage",
        "",
        "```python",
        card["usage"],
        "```",
        "",
        "## Intended use and limitations",
        "",
        card["intended_use"],
        "",
        *[f"- {line}" for line in card["limitations"]],
        "",
        "## License",
        "",
        f"{card['license']}; the training data's own terms apply.",
        "",
        "## Citation",
        "",
        f"- method: {card['citation']['method']}",
        f"- dataset: {card['citation']['dataset']}",
        "",
    ]
    return "\n".join(lines)
