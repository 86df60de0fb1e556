"""The raw loaders (data/loaders.py): what each format reads, how each mistake is reported, and how a dataset's
name or path resolves to a file and its format."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedrecgel_secure.data import loaders
from fedrecgel_secure.data.loaders import (
    FORMATS,
    RawInteractions,
    find_recbole_ml100k,
    read_interactions,
    resolve_dataset,
)
from fedrecgel_secure.errors import BadInputError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def read(tmp_path: Path, name: str, text: str, fmt: str) -> RawInteractions:
    return read_interactions(write(tmp_path, name, text), fmt)


def test_filmtrust_reads_every_row_including_repeats_and_skips_blank_lines(tmp_path):
    raw = read(tmp_path, "ratings.txt", "1 1 2\n1 3 3.5\n\n  \n2 1 4\n1 1 2", "filmtrust")
    assert raw.users.tolist() == [1, 1, 2, 1]
    assert raw.items.tolist() == [1, 3, 1, 1]
    assert raw.users.dtype == np.int64
    assert raw.timestamps is None
    assert raw.source.endswith("ratings.txt")


def test_lastfm_hetrec_reads_user_and_artist_columns(tmp_path):
    text = "userID\tartistID\tweight\n2\t51\t13883\n2\t52\t11690\n3\t51\t7\n"
    raw = read(tmp_path, "user_artists.dat", text, "lastfm-hetrec")
    assert raw.users.tolist() == [2, 2, 3]
    assert raw.items.tolist() == [51, 52, 51]
    assert raw.timestamps is None


def test_ml100k_reads_timestamps(tmp_path):
    raw = read(tmp_path, "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n", "ml-100k")
    assert raw.users.tolist() == [196, 186]
    assert raw.items.tolist() == [242, 302]
    assert raw.timestamps.dtype == np.float64
    assert raw.timestamps.tolist() == [881250949.0, 891717742.0]


def test_recbole_inter_picks_columns_by_the_name_before_the_colon(tmp_path):
    text = (
        "item_id:token\trating:float\ttimestamp:float\tuser_id:token\n242\t3\t881250949\t196\n302\t3\t891717742\t186\n"
    )
    raw = read(tmp_path, "ml-100k.inter", text, "recbole-inter")
    assert raw.users.tolist() == [196, 186]
    assert raw.items.tolist() == [242, 302]
    assert raw.timestamps.tolist() == [881250949.0, 891717742.0]


def test_recbole_inter_without_timestamp_column_has_none(tmp_path):
    raw = read(tmp_path, "x.inter", "user_id:token\titem_id:token\n1\t2\n", "recbole-inter")
    assert raw.timestamps is None


def test_csv_columns_in_any_order_with_string_ids(tmp_path):
    raw = read(tmp_path, "d.csv", "item,rating,user,timestamp\nB01,5,u1,100\nB02,4.0,u2,50.5\n", "csv")
    assert raw.users.tolist() == ["u1", "u2"]
    assert raw.items.tolist() == ["B01", "B02"]
    assert raw.timestamps.tolist() == [100.0, 50.5]


def test_csv_without_timestamp_and_with_id_suffixed_names(tmp_path):
    raw = read(tmp_path, "d.csv", "user_id,item_id\n1,2\n1,3\n", "csv")
    assert raw.users.tolist() == [1, 1]
    assert raw.items.tolist() == [2, 3]
    assert raw.timestamps is None


def test_csv_tolerates_crlf_a_byte_order_mark_and_quotes(tmp_path):
    raw = read(tmp_path, "d.csv", '\ufeffuser,item,timestamp\r\n"a,1",x,1\r\nb,y,2\r\n', "csv")
    assert raw.users.tolist() == ["a,1", "b"]
    assert raw.timestamps.tolist() == [1.0, 2.0]


def test_token_ids_that_only_look_like_integers_stay_distinct(tmp_path):
    raw = read(tmp_path, "d.csv", "user,item\n007,1\n7,1\n", "csv")
    assert raw.users.tolist() == ["007", "7"]


@pytest.mark.parametrize("header", ["", "user,item,rating,timestamp\n", "userId,productId,Rating,Time\n"])
def test_amazon_reads_with_or_without_a_header(tmp_path, header):
    rows = "A1EE2E3N7PW666,B000GFDAUG,5.0,1202256000\nAGZ8SM1BGK3CK,B000GFDAUG,1.0,1198195200\n"
    raw = read(tmp_path, "ratings_Amazon_Instant_Video.csv", header + rows, "amazon")
    assert raw.users.tolist() == ["A1EE2E3N7PW666", "AGZ8SM1BGK3CK"]
    assert raw.items.tolist() == ["B000GFDAUG", "B000GFDAUG"]
    assert raw.timestamps.tolist() == [1202256000.0, 1198195200.0]


def test_tenrec_ignores_other_columns_and_has_no_timestamps(tmp_path):
    text = "user_id,item_id,click,gender,age\n0,10,1,1,3\n0,11,1,1,3\n5,10,1,2,4\n"
    raw = read(tmp_path, "QB-article.csv", text, "tenrec")
    assert raw.users.tolist() == [0, 0, 5]
    assert raw.items.tolist() == [10, 11, 10]
    assert raw.timestamps is None


def test_tenrec_reads_a_timestamp_column_when_present(tmp_path):
    raw = read(tmp_path, "QB-article.csv", "timestamp,user_id,item_id\n9,0,10\n", "tenrec")
    assert raw.timestamps.tolist() == [9.0]


def test_bundled_filmtrust():
    path, fmt = resolve_dataset("filmtrust")
    raw = read_interactions(path, fmt)
    # `wc -l` says 35,497: the file's last line has no newline, so there are 35,498 rows.
    assert raw.users.size == raw.items.size == 35_498
    assert np.unique(raw.users).size == 1_508
    assert np.unique(raw.items).size == 2_071
    assert raw.timestamps is None


def test_missing_file(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(BadInputError, match="no such file") as e:
        read_interactions(path, "filmtrust")
    assert str(path) in str(e.value)


def test_directory(tmp_path):
    with pytest.raises(BadInputError, match="is a directory") as e:
        read_interactions(tmp_path, "filmtrust")
    assert str(tmp_path) in str(e.value)


@pytest.mark.parametrize("text", ["", "\n  \n\n"])
def test_empty_file(tmp_path, text):
    path = write(tmp_path, "ratings.txt", text)
    with pytest.raises(BadInputError, match="empty") as e:
        read_interactions(path, "filmtrust")
    assert str(path) in str(e.value)


def test_header_without_rows(tmp_path):
    path = write(tmp_path, "d.csv", "user,item\n\n")
    with pytest.raises(BadInputError, match="no interactions after the header on line 1") as e:
        read_interactions(path, "csv")
    assert str(path) in str(e.value)


def test_wrong_field_count_names_the_line(tmp_path):
    path = write(tmp_path, "ratings.txt", "1 1 2\n\n1 2\n")
    with pytest.raises(BadInputError) as e:
        read_interactions(path, "filmtrust")
    assert str(e.value) == f"{path}:3: expected 'user item rating', got 2 fields"


@pytest.mark.parametrize(
    "fmt, text, line",
    [
        ("lastfm-hetrec", "userID\tartistID\tweight\n2\t51\t1\n2\t52\n", 3),
        ("ml-100k", "1\t2\t3\t4\n1 2 3 4\n", 2),
        ("recbole-inter", "user_id:token\titem_id:token\n1\t2\n1\t2\t3\n", 3),
        ("csv", "user,item,rating\n1,2,3\n1,2\n", 3),
        ("amazon", "a,b,5.0,100\na,b,5.0\n", 2),
        ("amazon", "a,b,5.0\n", 1),
        ("tenrec", "user_id,item_id,click\n\n\n1,2\n", 4),
    ],
)
def test_wrong_field_count_in_every_format(tmp_path, fmt, text, line):
    path = write(tmp_path, "f", text)
    with pytest.raises(BadInputError, match="expected .* got .* field") as e:
        read_interactions(path, fmt)
    assert str(e.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize(
    "fmt, text, line, column",
    [
        ("ml-100k", "1\t2\t3\t4\n1\t2\t3\tnoon\n", 2, "timestamp"),
        ("recbole-inter", "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n1\t2\t\n", 3, "timestamp:float"),
        ("csv", "user,item,timestamp\n1,2,inf\n", 2, "timestamp"),
        ("amazon", "a,b,5,1\na,b,5,nan\n", 2, "timestamp"),
    ],
)
def test_unparsable_timestamp_names_line_and_column(tmp_path, fmt, text, line, column):
    path = write(tmp_path, "f", text)
    with pytest.raises(BadInputError) as e:
        read_interactions(path, fmt)
    assert str(e.value).startswith(f"{path}:{line}: column '{column}'")


def test_missing_header_column_names_column_and_file(tmp_path):
    path = write(tmp_path, "d.csv", "user,rating\n1,2\n")
    with pytest.raises(BadInputError, match="no 'item' column") as e:
        read_interactions(path, "csv")
    assert str(e.value).startswith(f"{path}:1: ")


def test_headerless_csv_points_at_the_amazon_format(tmp_path):
    path = write(tmp_path, "ratings_Amazon_Instant_Video.csv", "A1,B1,5.0,1202256000\n")
    with pytest.raises(BadInputError, match="amazon") as e:
        read_interactions(path, "csv")
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    "fmt, header, column",
    [
        ("lastfm-hetrec", "user\tartist\tweight", "userID"),
        ("recbole-inter", "user_id:token\trating:float", "item_id"),
        ("tenrec", "uid,item_id", "user_id"),
    ],
)
def test_missing_header_column_in_other_header_formats(tmp_path, fmt, header, column):
    path = write(tmp_path, "f", header + "\n")
    with pytest.raises(BadInputError, match=f"no '{column}' column") as e:
        read_interactions(path, fmt)
    assert str(path) in str(e.value)


def test_empty_id_field_names_the_line(tmp_path):
    path = write(tmp_path, "d.csv", "user,item\n1,2\n3, \n")
    with pytest.raises(BadInputError, match="empty 'item' field") as e:
        read_interactions(path, "csv")
    assert str(e.value).startswith(f"{path}:3: ")


def test_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "ratings.txt"
    path.write_bytes(b"1 1 2\n1 \xff 2\n")
    with pytest.raises(BadInputError, match="not UTF-8") as e:
        read_interactions(path, "filmtrust")
    assert str(e.value).startswith(f"{path}:2: ")


def test_unknown_format_lists_the_known_ones(tmp_path):
    path = write(tmp_path, "ratings.txt", "1 1 2\n")
    with pytest.raises(BadInputError, match="unknown format 'parquet'") as e:
        read_interactions(path, "parquet")
    assert str(path) in str(e.value)
    assert all(name in str(e.value) for name in FORMATS)


def test_filmtrust_resolves_to_the_bundled_file():
    path, fmt = resolve_dataset("filmtrust")
    assert path == Path(loaders.__file__).parent / "bundled" / "filmtrust" / "ratings.txt"
    assert path.is_file() and fmt == "filmtrust"


def test_ml100k_resolves_to_the_recbole_copy(monkeypatch, tmp_path):
    inter = write(tmp_path, "ml-100k.inter", "user_id:token\titem_id:token\n1\t2\n")
    monkeypatch.setattr(loaders, "find_recbole_ml100k", lambda: inter)
    assert resolve_dataset("ml-100k") == (inter, "recbole-inter")


def test_ml100k_without_recbole_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(loaders, "find_recbole_ml100k", lambda: None)
    with pytest.raises(BadInputError, match=r"pip install --no-deps recbole==1\.2\.1") as e:
        resolve_dataset("ml-100k")
    assert "u.data" in str(e.value)


def test_find_recbole_ml100k_locates_the_file_without_importing_recbole(monkeypatch, tmp_path):
    example = tmp_path / "recbole" / "dataset_example" / "ml-100k"
    example.mkdir(parents=True)
    (tmp_path / "recbole" / "__init__.py").write_text("raise RuntimeError('recbole must not be imported')\n")
    (example / "ml-100k.inter").write_text("user_id:token\titem_id:token\n")
    monkeypatch.delitem(sys.modules, "recbole", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_recbole_ml100k() == example / "ml-100k.inter"
    assert "recbole" not in sys.modules


def test_find_recbole_ml100k_without_recbole(monkeypatch):
    monkeypatch.setattr(loaders.importlib.util, "find_spec", lambda name: None)
    assert find_recbole_ml100k() is None


@pytest.mark.parametrize("name", ["lastfm-2k", "amazon-video", "ml-1m", "ml-20m", "ml-25m"])
def test_downloadable_datasets_that_are_not_bundled_point_at_fetch(name):
    with pytest.raises(BadInputError, match="not bundled") as e:
        resolve_dataset(name)
    assert f"fedrecgel data fetch {name} --to DIR" in str(e.value)
    assert "data.path" in str(e.value)


def test_qb_article_explains_the_application():
    with pytest.raises(BadInputError, match="not bundled") as e:
        resolve_dataset("qb-article")
    assert "tenrec_dataset.html" in str(e.value)
    assert "data fetch" not in str(e.value)


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("u.data", "ml-100k"),
        ("user_artists.dat", "lastfm-hetrec"),
        ("ml-100k.inter", "recbole-inter"),
        ("ratings.txt", "filmtrust"),
        ("other.TXT", "filmtrust"),
        ("QB-article.csv", "csv"),
    ],
)
def test_format_is_guessed_from_the_file_name(tmp_path, name, fmt):
    path = write(tmp_path, name, "")
    assert resolve_dataset(str(path)) == (path, fmt)


def test_a_given_format_wins_over_the_guess(tmp_path):
    path = write(tmp_path, "ratings_Amazon_Instant_Video.csv", "")
    assert resolve_dataset(str(path), "amazon") == (path, "amazon")


def test_unguessable_format(tmp_path):
    path = write(tmp_path, "data.parquet", "")
    with pytest.raises(BadInputError, match="cannot guess") as e:
        resolve_dataset(str(path))
    assert str(path) in str(e.value) and "recbole-inter" in str(e.value)


def test_resolve_unknown_format(tmp_path):
    path = write(tmp_path, "u.data", "")
    with pytest.raises(BadInputError, match="unknown format 'xls'"):
        resolve_dataset(str(path), "xls")


def test_resolve_missing_path_or_directory(tmp_path):
    with pytest.raises(BadInputError, match="no such file") as e:
        resolve_dataset(str(tmp_path / "movielens"))
    assert "filmtrust" in str(e.value)  # the registered names, in case a name was meant
    with pytest.raises(BadInputError, match="is a directory"):
        resolve_dataset(str(tmp_path))
