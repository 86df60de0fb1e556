"""federation.threads: torch's CPU threads, one by default, "auto" for every core, at most a study run's share."""

from __future__ import annotations

import pytest
import torch

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.federation import device
from fedrecgel_secure.policy import POLICY_DIR, load_policy


@pytest.fixture
def restore_threads(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(device, "_share", None)
    yield
    torch.set_num_threads(threads)


def test_one_thread_by_default_every_core_under_auto(restore_threads):
    assert load_policy(POLICY_DIR / "default.toml").federation.threads == 1
    assert device.use_threads(1) == 1 and torch.get_num_threads() == 1
    assert device.use_threads("auto") == device.cores() == torch.get_num_threads()
    with pytest.raises(BadInputError, match="threads"):
        load_policy(POLICY_DIR / "default.toml", ["federation.threads=0"])


def test_a_study_worker_keeps_its_share_of_the_cores_whatever_its_policy_asks(restore_threads):
    from fedrecgel_secure.study.run import _init_worker

    _init_worker(1)  # --jobs N on N cores or fewer: one thread a run
    assert torch.get_num_threads() == 1
    assert device.use_threads("auto") == 1 and device.use_threads(8) == 1


def test_one_thread_holds_inside_its_block_and_gives_the_count_back_after_an_error_too(restore_threads):
    torch.set_num_threads(2)
    with device.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="inside"), device.one_thread():
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2
