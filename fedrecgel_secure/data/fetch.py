"""Download a registered dataset's public file, for the datasets that have one.

Nothing is half-written: the download lands in a temporary file in the target
folder and is renamed into place only once complete, and a zip is checked in
full before any member is extracted. Where the registry knows the download's
SHA-256 (:attr:`~fedrecgel_secure.data.datasets.DatasetInfo.sha256`), other bytes
are refused before anything is kept.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from fedrecgel_secure.data.datasets import DATASETS
from fedrecgel_secure.errors import BadInputError


def fetch_dataset(name: str, to_dir: Path, *, timeout: float = 30.0) -> Path:
    """Download dataset ``name`` into ``to_dir`` and return the data file to read."""
    info = DATASETS.get(name)
    if info is None:
        raise BadInputError(f"unknown dataset {name!r}; registered datasets: {', '.join(DATASETS)}")
    if info.url is None:
        raise BadInputError(
            f"{name} cannot be downloaded automatically. {info.description} "
            f"Once you have its {info.filename}, pass the path to `fedrecgel train --set data.path=...`."
        )
    to_dir = Path(to_dir)
    try:
        to_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=to_dir, prefix=f".{name}-", suffix=".part")
    except OSError as e:
        raise BadInputError(f"{to_dir}: cannot write to the download folder ({e.strerror or e})") from None

    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(info.url, timeout=timeout) as response:
                digest = _copy_hashing(response, out)
        # HTTPError and TimeoutError are among these; a truncated body is an HTTPException.
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            raise BadInputError(
                f"could not download {name} from {info.url} ({_reason(e)}); this machine may have no "
                f"internet access. Download it by hand, and pass the path of its {info.filename} "
                f"to `fedrecgel train --set data.path=...`."
            ) from None
        if info.sha256 is not None and digest != info.sha256:
            raise BadInputError(
                f"the download of {name} from {info.url} is not the published file: its SHA-256 is {digest}, "
                f"expected {info.sha256}; nothing was kept. Try again, or download it by hand and check it."
            )
        if not zipfile.is_zipfile(tmp):
            target = to_dir / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
            return target
        archive = to_dir / (PurePosixPath(urllib.parse.urlparse(info.url).path).name or f"{name}.zip")
        os.replace(tmp, archive)
    finally:
        tmp.unlink(missing_ok=True)

    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.namelist()
            _check_members(archive, members, to_dir)
            zf.extractall(to_dir)
    except BadInputError:
        archive.unlink()  # a refused archive is not kept for a later, careless unzip
        raise
    except (zipfile.BadZipFile, OSError) as e:
        raise BadInputError(f"{archive}: cannot extract the downloaded archive ({e})") from None
    if (to_dir / info.filename).is_file():
        return to_dir / info.filename
    # Some archives nest their files in a folder of their own: take the one member of that name.
    wanted = PurePosixPath(info.filename).name
    matches = [m for m in members if PurePosixPath(m).name == wanted]
    if len(matches) != 1:
        raise BadInputError(
            f"{archive}: expected one {info.filename} in the archive, found {len(matches)} "
            f"(members: {', '.join(members[:10])}{', ...' if len(members) > 10 else ''})"
        )
    return to_dir / matches[0]


def _copy_hashing(source, out) -> str:
    """Copy ``source`` to ``out`` and return the SHA-256 hex digest of what was copied."""
    digest = hashlib.sha256()
    while block := source.read(1 << 20):
        digest.update(block)
        out.write(block)
    return digest.hexdigest()


def _check_members(archive: Path, members: list[str], to_dir: Path) -> None:
    """Refuse an archive with any member that would land outside ``to_dir`` (zip slip)."""
    root = to_dir.resolve()
    for member in members:
        if not (root / member).resolve().is_relative_to(root):
            raise BadInputError(f"{archive}: member {member!r} would be written outside {to_dir}; refusing to extract")


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__
