"""A run's shared model exported for use elsewhere: safetensors, the item ids, and a model card.

``fedrecgel export RUN --out DIR`` writes

==============================  ===============================================================
``model.safetensors``           the shared model: ``item_embeddings`` ([GMF | MLP] per item), the MLP tower
                                (``mlp.0.weight`` ...) and ``predict.weight/bias``; its metadata holds the
                                architecture (:func:`load_export` rebuilds :class:`~fedrecgel_secure.model.NeuMF`)
``items.txt``                   the data file's id of item ``i`` on line ``i + 1`` (when the data file is here)
``user_embeddings.safetensors`` only with ``--include-user-embeddings``: ``theta``, one private row per user
                                (0600), and ``users.txt`` their file ids
``model_card.json``, ``.md``    the model card (:func:`model_card`): data and split, policy digest, best and
                                final metrics, the privacy guarantee against each observer, what the export holds
==============================  ===============================================================

The private user embeddings are not exported unless asked for: they are each user's own parameters, which
client-level DP does not cover (it protects what the shared model reveals, not a user's own row).
ONNX is not written: NeuMF is a few matrix products over these tensors (:func:`~fedrecgel_secure.model.head`),
and its scoring needs the user's private row, which an ONNX graph of the shared part alone could not hold.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.directory import CHECKPOINT, RESOLVED, atomic_write_bytes, atomic_write_json, read_summary

MODEL = "model.safetensors"
USERS = "user_embeddings.safetensors"
ITEM_IDS = "items.txt"
USER_IDS = "users.txt"
CARD_JSON = "model_card.json"
CARD_MD = "model_card.md"
EXPORT_FORMAT = "1"
USERS_MODE = 0o600  # every user's private row: readable by the owner only, as the checkpoint is


def model_card(run_dir: Path, policy, summary, *, users_included: bool, item_ids: bool) -> dict:
    """What a reader of an export must know: where the model came from, how good it is, what privacy it has."""
    from fedrecgel_secure import __version__
    from fedrecgel_secure.tracking import WITHHELD, seeded_noise

    d = policy.data
    p = summary.privacy
    if p is None:
        privacy = {"dp": False, "guarantee": "none: trained without differential privacy"}
    else:
        privacy = {
            "dp": True,
            "epsilon": {"release": p.epsilon, "server": p.epsilon_server},
            "delta": p.delta,
            "noise": p.noise,
            "seeded": p.noise == "seeded",
            "guarantee": p.guarantee,
            "mode": p.mode,
            "accountant": p.accountant,
            "sampler": p.sampler,
            "noise_multiplier": p.noise_multiplier,
            "sample_rate": p.sample_rate,
            "clip_norm": p.clip_norm,
            "server_rounds": p.server_rounds,
        }
    secagg = summary.secure_aggregation
    return {
        "format": EXPORT_FORMAT,
        "package": {"name": "fedrecgel-secure", "version": __version__},
        "run": str(run_dir),
        "method": summary.method,
        "model": {
            "architecture": "NeuMF",
            "gmf_dim": policy.model.gmf_dim,
            "mlp_dim": policy.model.mlp_dim,
            "tower": list(policy.model.tower),
            "dtype": policy.model.dtype,
        },
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
        "rounds": {"done": summary.rounds_done, "planned": summary.rounds_planned},
        "select_by": summary.select_by,
        "best": summary.best,
        "final": summary.final,
        "privacy": privacy,
        "secure_aggregation": "none" if secagg is None else secagg.describe(),
        "contents": {
            "shared_model": MODEL,
            "item_ids": ITEM_IDS if item_ids else None,
            "user_embeddings": USERS if users_included else None,
        },
    }


def _metric_rows(card: dict) -> list[str]:
    keys = [f"{m}@{k}" for m in ("hr", "ndcg") for k in (5, 10, 15, 20)]
    best, final = card["best"] or {}, card["final"] or {}
    rows = ["| metric | best | final |", "| --- | ---: | ---: |"]
    rows.append(f"| round | {best.get('round', '-')} | {final.get('round', '-')} |")
    rows += [f"| {k.upper()} | {best.get(k, float('nan')):.4f} | {final.get(k, float('nan')):.4f} |" for k in keys]
    return rows


def card_markdown(card: dict) -> str:
    """The model card as Markdown: the same facts as the JSON."""
    d, p = card["data"], card["privacy"]
    if p["dp"]:
        server = "no bound (it sees the clipped uploads)" if p["epsilon"]["server"] is None else p["epsilon"]["server"]
        privacy = [
            f"- client-level DP ({p['mode']} noise, {p['accountant']}, sampler {p['sampler']}):"
            f" ε = {p['epsilon']['release']} against anyone who sees the released models,"
            f" ε = {server} against the server; δ = {p['delta']}",
            f"- noise: **{p['noise']}**" + (" (SEEDED: research mode)" if p["seeded"] else ""),
            f"- guarantee: {p['guarantee']}",
        ]
    else:
        privacy = [f"- {p['guarantee']}"]
    contents = card["contents"]
    users = (
        f"`{contents['user_embeddings']}`: every user's private embedding (0600; not covered by DP)"
        if contents["user_embeddings"]
        else "**not included** (each user's private embedding stays in the run's checkpoint)"
    )
    lines = [
        f"# Model card: {card['method']} on {d['dataset']}",
        "",
        f"Exported by fedrecgel-secure {card['package']['version']} from `{card['run']}`"
        f" (round {card['rounds']['done']} of {card['rounds']['planned']}).",
        "",
        "## Data",
        "",
        f"- dataset `{d['dataset']}`, protocol {d['protocol']}: {d['users']:,} users, {d['items']:,} items"
        + ("" if d.get("interactions") is None else f", {d['interactions']:,} interactions"),
        f"- split: {d['split']}; users with at least {d['min_interactions']} interactions,"
        f" {d['test_negatives']} test negatives, seed {d['seed']}",
        f"- policy digest: `{card['policy_digest']}`",
        "",
        f"## Metrics (best by {card['select_by']}, and final)",
        "",
        *_metric_rows(card),
        "",
        "## Privacy",
        "",
        *privacy,
        f"- secure aggregation: {card['secure_aggregation']}",
        "",
        "## Contents",
        "",
        f"- `{contents['shared_model']}`: the shared model (item embeddings, MLP tower, prediction layer)",
        f"- item ids: `{contents['item_ids']}`" if contents["item_ids"] else "- item ids: indices 0 .. n-1",
        f"- user embeddings: {users}",
        "",
    ]
    return "\n".join(lines)


def export_run(run_dir: Path, out_dir: Path, *, include_user_embeddings: bool = False) -> list[Path]:
    """Write the export of ``run_dir`` into ``out_dir``; the files written."""
    from safetensors.torch import save

    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.runs.checkpoint import load_checkpoint
    from fedrecgel_secure.runs.directory import check_run_dir

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / RESOLVED).is_file():
        raise BadInputError(f"{run_dir}: not a run directory (no {RESOLVED})")
    policy = load_policy(run_dir / RESOLVED)
    state = load_checkpoint(run_dir / CHECKPOINT, "export")
    summary = read_summary(run_dir)
    if summary is None:
        raise BadInputError(f"{run_dir}: no summary.json yet (the run is training, or was killed): nothing to card")
    if include_user_embeddings and state.get("clients") is None:
        raise BadInputError(
            f"{run_dir}: a deployment's run directory holds no user embeddings (they never leave their nodes);"
            " export without --include-user-embeddings"
        )
    check_run_dir(out_dir)
    model = {k: v.contiguous() for k, v in state["model"].items()}
    n_items = int(model["item_embeddings"].shape[0])
    architecture = {
        "format": EXPORT_FORMAT,
        "n_items": str(n_items),
        "gmf_dim": str(policy.model.gmf_dim),
        "mlp_dim": str(policy.model.mlp_dim),
        "tower": json.dumps(list(policy.model.tower)),
    }
    written = [out_dir / MODEL]
    atomic_write_bytes(out_dir / MODEL, save(model, metadata=architecture))
    ids = _ids(policy)
    if ids is not None:
        written.append(out_dir / ITEM_IDS)
        atomic_write_bytes(out_dir / ITEM_IDS, "".join(f"{i}\n" for i in ids.items.tolist()).encode())
    if include_user_embeddings:
        theta = state["clients"]["theta"].contiguous()
        written.append(out_dir / USERS)
        atomic_write_bytes(out_dir / USERS, save({"theta": theta}, metadata={"format": EXPORT_FORMAT}), USERS_MODE)
        if ids is not None:
            written.append(out_dir / USER_IDS)
            atomic_write_bytes(out_dir / USER_IDS, "".join(f"{u}\n" for u in ids.users.tolist()).encode(), USERS_MODE)
    card = model_card(run_dir, policy, summary, users_included=include_user_embeddings, item_ids=ids is not None)
    atomic_write_json(out_dir / CARD_JSON, card)
    atomic_write_bytes(out_dir / CARD_MD, card_markdown(card).encode())
    return [*written, out_dir / CARD_JSON, out_dir / CARD_MD]


def _ids(policy):
    """The data file's ids, or None where the file is not here (a deployment's server holds no data)."""
    from fedrecgel_secure.data.ids import raw_ids

    try:
        return raw_ids(policy.data)
    except (BadInputError, OSError):
        return None


def load_export(out_dir: Path):
    """An export read back: (the shared :class:`~fedrecgel_secure.model.NeuMF`, the user embeddings or None,
    the model card)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from fedrecgel_secure.model import NeuMF

    out_dir = Path(out_dir)
    if not (out_dir / MODEL).is_file():
        raise BadInputError(f"{out_dir}: not an export (no {MODEL})")
    with safe_open(out_dir / MODEL, framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(out_dir / MODEL)
    model = NeuMF(int(meta["n_items"]), int(meta["gmf_dim"]), int(meta["mlp_dim"]), tuple(json.loads(meta["tower"])))
    model = model.to(tensors["item_embeddings"].dtype)
    model.load_state_dict(tensors)
    model.eval()
    theta = load_file(out_dir / USERS)["theta"] if (out_dir / USERS).is_file() else None
    return model, theta, json.loads((out_dir / CARD_JSON).read_text())
