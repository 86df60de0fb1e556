"""A run's shared model exported for use elsewhere: safetensors, the item ids, and a model card.

``fedrecgel export RUN --out DIR`` writes

==============================  ===============================================================
``model.safetensors``           the shared model: ``item_embeddings`` ([GMF | MLP] per item), the MLP tower
                                (``mlp.0.weight`` ...) and ``predict.weight/bias``; its metadata holds the
                                architecture (:func:`fedrecgel_secure.model.architecture`: dims, activation,
                                the [GMF | MLP] halves, each layer's input order), enough to score in any
                                framework; :func:`load_export` rebuilds :class:`~fedrecgel_secure.model.NeuMF`
``items.txt``                   the data file's id of item ``i`` on line ``i + 1`` (when the data file is here)
``user_embeddings.safetensors`` only with ``--include-user-embeddings``: ``theta``, one private row per user
                                (0600), and ``users.txt`` their file ids
``seen_items.csv``              only with ``--include-seen-items``: ``user,item``, each user's training items
                                (0600: users' own data), so an app can leave them out with no training data
``model_card.json``, ``.md``    the model card (:mod:`fedrecgel_secure.card`): architecture, data and split, the
                                exported round's metrics and the best round's, the privacy guarantee against
                                each observer, what the export holds
==============================  ===============================================================

An export goes into a new or empty folder; ``overwrite`` replaces an earlier export there.
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
SEEN = "seen_items.csv"
CARD_JSON = "model_card.json"
CARD_MD = "model_card.md"
EXPORT_FORMAT = "2"  # 2: the architecture in full (activation, halves, input orders) in the metadata and card
USERS_MODE = 0o600  # every user's private row: readable by the owner only, as the checkpoint is


EXPORT_FILES = (MODEL, USERS, ITEM_IDS, USER_IDS, SEEN, CARD_JSON, CARD_MD)


def check_export_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse, before any work, an ``--out`` that holds files already, unless ``overwrite``: an export written over
    another silently mixes two models' files."""
    from fedrecgel_secure.runs.directory import check_run_dir

    out_dir = Path(out_dir)
    if not overwrite and out_dir.is_dir() and any(out_dir.iterdir()):
        raise BadInputError(f"--out {out_dir}: exists and is not empty; pass --overwrite to replace the export there")
    check_run_dir(out_dir)


def export_run(
    run_dir: Path,
    out_dir: Path,
    *,
    include_user_embeddings: bool = False,
    include_seen_items: bool = False,
    overwrite: bool = False,
) -> list[Path]:
    """Write the export of ``run_dir`` into ``out_dir`` (new or empty, or any with ``overwrite``); the files
    written. With ``overwrite``, an earlier export's files that this one does not write are removed (a stale
    ``user_embeddings.safetensors`` would be read back as this model's); no other file is touched."""
    from safetensors.torch import save

    from fedrecgel_secure.card import card_markdown, model_card
    from fedrecgel_secure.model import architecture
    from fedrecgel_secure.policy import load_policy
    from fedrecgel_secure.runs.checkpoint import load_checkpoint
    from fedrecgel_secure.runs.directory import read_metrics

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / RESOLVED).is_file():
        raise BadInputError(f"{run_dir}: not a run directory (no {RESOLVED})")
    check_export_dir(out_dir, overwrite)
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
    ids = _ids(policy)
    if include_seen_items and (state.get("clients") is None or ids is None):
        raise BadInputError(
            f"{run_dir}: no data file here to read the users' items from (a deployment's server holds none);"
            " export without --include-seen-items"
        )
    model = {k: v.contiguous() for k, v in state["model"].items()}
    m = policy.model
    arch = architecture(int(model["item_embeddings"].shape[0]), m.gmf_dim, m.mlp_dim, tuple(m.tower))
    written = [out_dir / MODEL]
    atomic_write_bytes(out_dir / MODEL, save(model, metadata=safetensors_metadata(arch)))
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
    if include_seen_items:
        written.append(_write_seen(out_dir / SEEN, policy, ids))
    contents = {
        "shared_model": MODEL,
        "item_ids": ITEM_IDS if ids is not None else None,
        "user_embeddings": USERS if include_user_embeddings else None,
        "seen_items": SEEN if include_seen_items else None,
    }
    records = read_metrics(run_dir)
    card = model_card(run_dir, policy, summary, arch, int(state["round"]), records, contents, EXPORT_FORMAT)
    atomic_write_json(out_dir / CARD_JSON, card)
    atomic_write_bytes(out_dir / CARD_MD, card_markdown(card).encode())
    written += [out_dir / CARD_JSON, out_dir / CARD_MD]
    for stale in set(EXPORT_FILES) - {p.name for p in written}:
        (out_dir / stale).unlink(missing_ok=True)
    return written


def safetensors_metadata(arch: dict) -> dict[str, str]:
    """The architecture as safetensors metadata, whose values are strings: lists as JSON."""
    return {"format": EXPORT_FORMAT, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in arch.items()}}


def _write_seen(path: Path, policy, ids) -> Path:
    """Each user's training items, ``user,item`` rows by the data file's ids: what ``recommend`` leaves out."""
    from fedrecgel_secure.data.prepare import load_split

    split = load_split(policy.data)
    users, items = ids.users.tolist(), ids.items.tolist()
    rows = [
        f"{users[u]},{items[i]}\n"
        for u in range(split.n_users)
        for i in split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]].tolist()
    ]
    atomic_write_bytes(path, ("user,item\n" + "".join(rows)).encode(), USERS_MODE)
    return path


def read_seen(path: Path) -> dict[str, list[str]]:
    """``seen_items.csv`` back: user id -> its items' ids, in file order."""
    import csv

    seen: dict[str, list[str]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            seen.setdefault(row["user"], []).append(row["item"])
    return seen


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
    differs = sorted(k for k, v in safetensors_metadata(model.architecture()).items() if meta.get(k, v) != v)
    if differs:  # an export whose metadata describes another scorer than this version's NeuMF: never guess
        raise BadInputError(
            f"{out_dir / MODEL}: metadata {', '.join(differs)} differ from the NeuMF this version scores"
        )
    model = model.to(tensors["item_embeddings"].dtype)
    model.load_state_dict(tensors)
    model.eval()
    theta = load_file(out_dir / USERS)["theta"] if (out_dir / USERS).is_file() else None
    return model, theta, json.loads((out_dir / CARD_JSON).read_text())
