"""What an export promises a reader: it never lands on another export unasked, its file and card describe the
model well enough to score it without this package, and its card headlines the metrics of the weights it holds."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.cli import bad, fedrecgel


def plain_torch_scorer(export_dir):
    """A scorer written from ``model.safetensors`` (its tensors and metadata) and ``model_card.json`` alone, as a
    user of another framework would write it: no import of fedrecgel_secure, every layout choice read, not assumed."""
    from safetensors import safe_open

    with safe_open(export_dir / "model.safetensors", framework="pt") as f:
        meta = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    card = json.loads((export_dir / "model_card.json").read_text())["model"]
    for key in ("embedding_halves", "mlp_input", "predict_input", "tower_layers", "activation", "output"):
        assert (json.loads(meta[key]) if meta[key].startswith("[") else meta[key]) == card[key], key  # one story
    dims = {"gmf": int(meta["gmf_dim"]), "mlp": int(meta["mlp_dim"])}
    halves = json.loads(meta["embedding_halves"])
    activation = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[meta["activation"]]

    def split(rows):
        out, start = {}, 0
        for half in halves:
            out[half] = rows[..., start : start + dims[half]]
            start += dims[half]
        return out

    def score(user_row, items):
        u, v = split(user_row), split(tensors["item_embeddings"][items])
        parts = {"user_mlp": u["mlp"].expand(len(items), -1), "item_mlp": v["mlp"]}
        h = torch.cat([parts[p] for p in json.loads(meta["mlp_input"])], dim=1)
        for weight, bias in json.loads(meta["tower_layers"]):
            h = activation(h @ tensors[weight].T + tensors[bias])
        parts = {"gmf_product": u["gmf"] * v["gmf"], "tower_output": h}
        z = torch.cat([parts[p] for p in json.loads(meta["predict_input"])], dim=1)
        assert meta["output"] == "logit"
        return (z @ tensors["predict.weight"].T + tensors["predict.bias"]).squeeze(1)

    return score


def test_a_plain_torch_scorer_from_the_file_and_card_alone_equals_recommend(dp_run, tmp_path):
    out = tmp_path / "export"
    assert fedrecgel("export", dp_run, "--out", out, "--include-user-embeddings").returncode == 0
    from safetensors.torch import load_file

    theta = load_file(out / "user_embeddings.safetensors")["theta"]
    users = (out / "users.txt").read_text().split()
    items = (out / "items.txt").read_text().split()
    score = plain_torch_scorer(out)
    for user in ("7", "1"):
        result = fedrecgel("recommend", dp_run, "--user", user, "-k", 10, "--json", "--include-seen")
        assert result.returncode == 0, result.stderr
        listed = json.loads(result.stdout)
        logits = score(theta[users.index(user)], torch.arange(len(items)))
        top = torch.topk(logits, 10)
        assert [items[i] for i in top.indices.tolist()] == [str(r["item"]) for r in listed]
        assert top.values.tolist() == pytest.approx([r["score"] for r in listed], abs=1e-5)


def test_export_refuses_a_folder_with_files_unless_overwrite_which_removes_a_stale_export(dp_run, tmp_path):
    from fedrecgel_secure.export import export_run

    out = tmp_path / "export"
    export_run(dp_run, out, include_user_embeddings=True)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad(["export", dp_run, "--out", out], f"--out {out}: exists and is not empty; pass --overwrite", tmp_path)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # refused before anything was written
    (out / "notes.txt").write_text("mine")
    again = fedrecgel("export", dp_run, "--out", out, "--overwrite")
    assert again.returncode == 0, again.stderr
    # the earlier export's user rows are gone (they would be read back as this export's); other files are kept
    assert {p.name for p in out.iterdir()} == {
        "model.safetensors",
        "items.txt",
        "model_card.json",
        "model_card.md",
        "notes.txt",
    }
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_run(dp_run, empty)  # an empty folder holds nothing to lose


def test_the_card_headlines_the_metrics_of_the_exported_round_and_names_the_best_round_apart(dp_run, tmp_path):
    from fedrecgel_secure.card import card_markdown
    from fedrecgel_secure.export import load_export

    assert fedrecgel("export", dp_run, "--out", tmp_path / "export").returncode == 0
    _, _, card = load_export(tmp_path / "export")
    record = json.loads((dp_run / "metrics.jsonl").read_text().splitlines()[-1])
    state = torch.load(dp_run / "checkpoint.pt", weights_only=True)
    assert card["metrics"]["exported_round"] == state["round"] == record["round"]
    assert card["metrics"]["exported"] == record
    markdown = (tmp_path / "export" / "model_card.md").read_text()
    assert f"The exported weights are round {state['round']}'s: **HR@10 {record['hr@10']:.4f}" in markdown
    # where the best round is another one, the card says its weights are not the exported ones
    card["metrics"]["best"] = {**record, "round": 66, "hr@10": 0.99}
    markdown = card_markdown(card)
    assert "The best round by hr@10 was round 66 (other weights, not exported)." in markdown
    assert f"| round | {state['round']} | 66 |" in markdown


def test_the_card_has_the_sections_people_expect_and_yaml_metadata_with_both_epsilons(dp_run, tmp_path):
    yaml = pytest.importorskip("yaml")
    from fedrecgel_secure.export import export_run

    export_run(dp_run, tmp_path / "export")
    markdown = (tmp_path / "export" / "model_card.md").read_text()
    card = json.loads((tmp_path / "export" / "model_card.json").read_text())
    summary = json.loads((dp_run / "summary.json").read_text())
    _, front, body = markdown.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["epsilon_release"] == summary["privacy"]["epsilon"]
    assert meta["epsilon_server"] == summary["privacy"]["epsilon_server"]
    assert meta["metrics"]["hr@10"] == summary["final"]["hr@10"] and meta["license"] == "mit"
    headings = [line[3:] for line in body.splitlines() if line.startswith("## ")]
    assert headings == [
        "Architecture",
        "Data",
        "Metrics",
        "Privacy",
        "Contents",
        "Usage",
        "Intended use and limitations",
        "License",
        "Citation",
    ]
    assert "arXiv 2603.11503" in card["citation"]["method"] and "IJCAI 2013" in card["citation"]["dataset"]
    assert card["limitations"] and card["intended_use"] and card["usage"] in markdown
