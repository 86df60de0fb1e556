"""``examples/serve_export.py``, the small recommendation service, answers over a real export through FastAPI's test
client: a known user's list is ``recommend``'s, a new user's is the fold-in's, and bad input is a 422 naming it."""

from __future__ import annotations

import importlib.util

import pytest

from helpers import REPO
from helpers.data import write_ratings

pytest.importorskip("fastapi")
pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from fastapi.testclient import TestClient

    from fedrecgel_secure.export import export_run
    from fedrecgel_secure.federation.runner import open_trainer

    root = tmp_path_factory.mktemp("serve")
    data = write_ratings(root / "ratings.txt", n_users=30, n_items=90, per_user=(5, 20))
    open_trainer(root / "run", None, ["federation.rounds=2", f"data.dataset={data}", "data.test_negatives=20"]).run(
        root / "run"
    )
    export_run(root / "run", root / "export", include_user_embeddings=True, include_seen_items=True)
    spec = importlib.util.spec_from_file_location("serve_export", REPO / "examples" / "serve_export.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return TestClient(module.create_app(root / "export")), root / "export"


def test_the_service_answers_a_known_user_as_recommend_does(served):
    from fedrecgel_secure.serving import open_served

    client, export = served
    reply = client.get("/users/3/recommendations", params={"k": 5})
    assert reply.status_code == 200, reply.text
    expected = open_served(export).recommend_known("3", 5)
    assert [(r["item"], pytest.approx(r["score"])) for r in reply.json()] == expected and len(expected) == 5


def test_the_service_folds_in_a_new_user_from_its_items(served):
    from fedrecgel_secure.serving import open_served

    client, export = served
    given = open_served(export).item_ids[:3]
    reply = client.post("/recommendations", json={"items": given, "k": 4, "exclude": [given[-1]]})
    assert reply.status_code == 200, reply.text
    listed = [r["item"] for r in reply.json()]
    assert len(listed) == 4 and not set(listed) & set(given)  # its own items and the excluded one left out
    assert listed == [i for i, _ in open_served(export).recommend_new([given], 4, [given[-1]])[0]]


def test_bad_input_is_a_422_that_names_it(served):
    client, _ = served
    unknown = client.get("/users/nobody/recommendations")
    assert unknown.status_code == 422 and "no such user" in unknown.json()["detail"]
    bad_item = client.post("/recommendations", json={"items": ["no-such-item"]})
    assert bad_item.status_code == 422 and "no-such-item" in bad_item.json()["detail"]
    assert client.post("/recommendations", json={"items": []}).status_code == 422  # nothing to fold in from
