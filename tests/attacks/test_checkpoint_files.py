"""Attack: read a run's checkpoint, which holds every client's private embedding and the DP noise secret.

A local attacker (another user on the machine) tries three things: read the
checkpoint (it must be 0600 whatever the umask), plant a symlink where the
writer will put it (the link must be replaced, never followed), and pre-create
the temporary file the writer will use (its name must not be predictable, and
an existing file at that name must make the write fail rather than be reused).
"""

from __future__ import annotations

import os
import stat

import pytest

from fedrecgel_secure.runs.checkpoint import atomic_write_bytes, save_checkpoint


def test_a_checkpoint_is_readable_by_its_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0o000)
    try:
        save_checkpoint(tmp_path / "checkpoint.pt", {"secret": "x"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "checkpoint.pt").st_mode) == 0o600


def test_a_symlink_planted_at_the_checkpoint_is_replaced_not_followed(tmp_path):
    target = tmp_path / "attacker-readable.bin"
    target.write_bytes(b"")
    os.chmod(target, 0o644)
    (tmp_path / "checkpoint.pt").symlink_to(target)
    save_checkpoint(tmp_path / "checkpoint.pt", {"secret": "x"})
    assert target.read_bytes() == b""  # nothing was written through the link
    assert not (tmp_path / "checkpoint.pt").is_symlink()
    assert stat.S_IMODE(os.stat(tmp_path / "checkpoint.pt").st_mode) == 0o600


def test_the_temporary_file_has_an_unpredictable_name_and_is_never_reused(tmp_path, monkeypatch):
    opened = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):
        opened.append((str(path), flags))
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    for _ in range(2):
        atomic_write_bytes(tmp_path / "summary.json", b"{}")
    temporary = [(p, f) for p, f in opened if ".tmp-" in p]
    assert len(temporary) == 2 and temporary[0][0] != temporary[1][0]
    assert all(f & os.O_EXCL and f & os.O_NOFOLLOW for _, f in temporary)
    # a file (or link) planted at the temporary name makes the write fail instead of writing into it
    monkeypatch.setattr("secrets.token_hex", lambda n: "planted")
    planted = tmp_path / ".summary.json.tmp-planted"
    planted.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        atomic_write_bytes(tmp_path / "summary.json", b"{}")
    assert not (tmp_path / "elsewhere").exists()
