"""Memory grows with interactions, not users x items: QB-article's shape fits in 2 GB."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from fedrecgel_secure.data.split import prepare_split
from fedrecgel_secure.data.synthetic import synthetic_interactions

from helpers import REPO

ROOT = REPO


def test_the_synthetic_generator_gives_the_asked_shape():
    split = prepare_split(synthetic_interactions(3000, 900, 40_000, seed=1), test_negatives=20)
    assert split.n_users == 3000 and split.n_items == 900
    assert 0.95 * 40_000 <= split.n_interactions <= 40_000
    assert np.diff(split.seen_indptr).min() >= 5


def test_a_qb_article_sized_round_and_evaluation_peak_below_2_gb():
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["users"] == 24_508 and report["items"] == 7_352 and report["interactions"] > 340_000
    assert report["peak_rss_mb"] <= 2048, report
