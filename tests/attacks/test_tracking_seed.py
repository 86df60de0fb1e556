"""Attack on experiment tracking: read a seeded-noise run's noise seed out of its TensorBoard and MLflow logs.

Under ``privacy.dp.noise = "seeded"`` the client sample and every noise draw follow
from the policy's ``seed``: whoever has it removes the noise. Tracker logs travel
further than run directories (a shared MLflow server, TensorBoard.dev-style
uploads), so they must not carry it. The attacker reads everything the trackers
hold and tries two ways: the seed as a logged parameter or text, and a brute force
over seeds of the logged policy against any SHA-256 digest found in the logs (the
policy digest hashes the policy, seed included, and a seed is a small number).
What it recovered before the seed and digest were withheld is in the report of the
change that added tracking: the seed from the ``seed`` parameter, and again from
the digest in 1,235 tries.
"""

from __future__ import annotations

import re
import tomllib

import pytest

from fedrecgel_secure.federation.runner import open_trainer
from fedrecgel_secure.policy import Policy, load_policy

from helpers.tracking import logged_bytes, mlflow_of, tensorboard_texts, tiny_policy

SEED = 1234
TRIES = 1300  # covers SEED: a logged digest would give it away


@pytest.mark.slow
def test_the_trackers_of_a_seeded_noise_run_give_away_neither_the_seed_nor_a_digest_that_reveals_it(tmp_path):
    run_dir = tmp_path / "run"
    open_trainer(run_dir, tiny_policy(tmp_path, rounds=2, noise="seeded", seed=SEED)).run(run_dir)
    c, run_id = mlflow_of(run_dir)
    run = c.get_run(run_id)

    # 1. the seed as a parameter, or anywhere as text
    assert "withheld" in run.data.params["seed"]
    blob = logged_bytes(run_dir)
    assert not re.search(rb"seed\W{0,8}" + str(SEED).encode() + rb"\b", blob)

    # 2. the logged policy, completed with each candidate seed, against every digest the logs hold
    logged = tomllib.loads(tensorboard_texts(run_dir)["policy"].removeprefix("```toml\n").removesuffix("```"))
    assert logged["privacy"]["dp"]["noise"] == "seeded"  # the attacker does have the rest of the policy
    digests = set(re.findall(rb"\b[0-9a-f]{64}\b", blob)) - {run_id.encode()}
    recovered = [s for s in range(TRIES) if Policy.model_validate({**logged, "seed": s}).digest().encode() in digests]
    assert recovered == []
    # the brute force is sound: the logged policy with the true seed is the run's policy, digest for digest
    truth = load_policy(run_dir / "policy.resolved.toml").digest()
    assert Policy.model_validate({**logged, "seed": SEED}).digest() == truth and truth.encode() not in blob

    # the run says what it is: no guarantee against whoever has the seed
    assert "NONE" in run.data.tags["fedrecgel.guarantee"]
