"""The dataset registry (data/datasets.py): each entry consistent, the MovieLens archives at GroupLens with their
digests."""

from __future__ import annotations

from fedrecgel_secure.data.datasets import DATASETS
from fedrecgel_secure.data.loaders import FORMATS


def test_registry_entries_are_consistent():
    movielens = {"ml-100k", "ml-1m", "ml-20m", "ml-25m"}
    assert set(DATASETS) == {"filmtrust", "lastfm-2k", "amazon-video", "qb-article", *movielens}
    assert [n for n, info in DATASETS.items() if info.bundled] == ["filmtrust"]
    for name, info in DATASETS.items():
        assert info.name == name
        assert info.fmt in FORMATS
        assert info.citation and info.description and info.filename
    assert DATASETS["qb-article"].url is None
    assert "tenrec_dataset.html" in DATASETS["qb-article"].description


def test_movielens_archives_are_registered_with_grouplens_urls_and_digests():
    for name, member in [("ml-1m", "ratings.dat"), ("ml-20m", "ratings.csv"), ("ml-25m", "ratings.csv")]:
        info = DATASETS[name]
        assert info.url == f"https://files.grouplens.org/datasets/movielens/{name}.zip"
        assert info.filename == f"{name}/{member}"
        assert len(info.sha256) == 64 and int(info.sha256, 16) >= 0
