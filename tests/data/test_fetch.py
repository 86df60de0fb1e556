"""Fetching a registered dataset (data/fetch.py) from a real HTTP server on 127.0.0.1: what each archive gives, and
how each failure is reported with nothing left behind."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

import pytest

from fedrecgel_secure.data.datasets import DATASETS
from fedrecgel_secure.data.fetch import fetch_dataset
from fedrecgel_secure.data.loaders import read_interactions
from fedrecgel_secure.errors import BadInputError


def make_zip(path: Path, members: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A real HTTP server on 127.0.0.1 serving a few archives and a plain CSV."""
    for var in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "served"
    root.mkdir()
    make_zip(root / "filmtrust.zip", {"ratings.txt": "1 1 2\n2 1 3\n", "trust.txt": "1 2 1\n"})
    make_zip(root / "ml-100k.zip", {"ml-100k/u.data": "1\t2\t3\t4\n", "ml-100k/u.item": ""})
    make_zip(root / "nested.zip", {"hetrec/user_artists.dat": "userID\tartistID\tweight\n2\t51\t1\n"})
    make_zip(root / "ml-1m.zip", {"ml-1m/ratings.dat": "1::1193::5::978300760\n", "ml-1m/movies.dat": ""})
    make_zip(root / "slip.zip", {"user_artists.dat": "", "../evil.txt": "gotcha"})
    (root / "ratings.csv").write_text("A1,B1,5.0,1202256000\n")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def point(monkeypatch, name: str, url: str, sha256: str | None = None) -> None:
    """Serve dataset ``name`` from ``url``, checked against ``sha256`` (the registry's digest is the real file's)."""
    monkeypatch.setitem(DATASETS, name, dataclasses.replace(DATASETS[name], url=url, sha256=sha256))


def test_fetch_extracts_a_zip_and_returns_the_data_file(server, monkeypatch, tmp_path):
    point(monkeypatch, "filmtrust", f"{server}/filmtrust.zip")
    to_dir = tmp_path / "data"
    path = fetch_dataset("filmtrust", to_dir)
    assert path == to_dir / "ratings.txt"
    assert (to_dir / "trust.txt").is_file()
    assert read_interactions(path, "filmtrust").users.tolist() == [1, 2]
    assert not list(to_dir.glob("*.part"))


def test_fetch_returns_a_file_inside_the_archive_folder(server, monkeypatch, tmp_path):
    point(monkeypatch, "ml-100k", f"{server}/ml-100k.zip")
    assert fetch_dataset("ml-100k", tmp_path) == tmp_path / "ml-100k" / "u.data"


def test_fetch_finds_the_data_file_when_the_archive_nests_it(server, monkeypatch, tmp_path):
    point(monkeypatch, "lastfm-2k", f"{server}/nested.zip")
    path = fetch_dataset("lastfm-2k", tmp_path)
    assert path == tmp_path / "hetrec" / "user_artists.dat"


def test_fetch_saves_a_plain_file_under_the_registered_name(server, monkeypatch, tmp_path):
    point(monkeypatch, "amazon-video", f"{server}/ratings.csv")
    path = fetch_dataset("amazon-video", tmp_path)
    assert path == tmp_path / "ratings_Amazon_Instant_Video.csv"
    assert read_interactions(path, "amazon").users.tolist() == ["A1"]


def test_fetch_refuses_a_zip_slip_member(server, monkeypatch, tmp_path):
    point(monkeypatch, "lastfm-2k", f"{server}/slip.zip")
    to_dir = tmp_path / "deep" / "data"
    with pytest.raises(BadInputError, match=r"'\.\./evil\.txt' would be written outside"):
        fetch_dataset("lastfm-2k", to_dir)
    assert not (to_dir.parent / "evil.txt").exists()
    assert list(to_dir.iterdir()) == []


def test_fetch_unreachable_url_gives_a_clear_message_and_leaves_nothing(monkeypatch, tmp_path):
    point(monkeypatch, "lastfm-2k", "http://127.0.0.1:9/hetrec.zip")
    with pytest.raises(BadInputError) as e:
        fetch_dataset("lastfm-2k", tmp_path, timeout=5)
    message = str(e.value)
    assert message.startswith("could not download lastfm-2k from http://127.0.0.1:9/hetrec.zip (")
    assert "no internet access" in message and "fedrecgel train --set data.path=" in message
    assert list(tmp_path.iterdir()) == []


def test_fetch_http_error(server, monkeypatch, tmp_path):
    point(monkeypatch, "lastfm-2k", f"{server}/missing.zip")
    to_dir = tmp_path / "data"
    with pytest.raises(BadInputError, match="HTTP 404"):
        fetch_dataset("lastfm-2k", to_dir)
    assert list(to_dir.iterdir()) == []


def test_fetch_unknown_name_lists_the_registered_ones(tmp_path):
    with pytest.raises(BadInputError, match="unknown dataset 'netflix'") as e:
        fetch_dataset("netflix", tmp_path)
    assert all(name in str(e.value) for name in DATASETS)


def test_fetch_without_url_explains_where_to_get_it(tmp_path):
    with pytest.raises(BadInputError, match="cannot be downloaded automatically") as e:
        fetch_dataset("qb-article", tmp_path)
    assert "tenrec_dataset.html" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_fetch_checks_the_published_sha256(server, monkeypatch, tmp_path):
    served = hashlib.sha256((tmp_path / "served" / "ml-1m.zip").read_bytes()).hexdigest()
    point(monkeypatch, "ml-1m", f"{server}/ml-1m.zip", sha256=served)
    path = fetch_dataset("ml-1m", tmp_path / "data")
    assert path == tmp_path / "data" / "ml-1m" / "ratings.dat"
    assert read_interactions(path, "ml-1m").items.tolist() == [1193]


def test_fetch_refuses_a_download_with_another_sha256_and_keeps_nothing(server, monkeypatch, tmp_path):
    point(monkeypatch, "ml-1m", f"{server}/ml-1m.zip", sha256=DATASETS["ml-1m"].sha256)
    to_dir = tmp_path / "data"
    with pytest.raises(BadInputError, match="is not the published file: its SHA-256 is [0-9a-f]{64}, expected a6898a"):
        fetch_dataset("ml-1m", to_dir)
    assert list(to_dir.iterdir()) == []
