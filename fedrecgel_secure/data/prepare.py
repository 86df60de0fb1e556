"""From a data policy to a prepared :class:`Split`, cached on disk.

The cache key is the SHA-256 of the raw file's bytes together with every
preprocessing parameter, so a changed file or setting never reuses a stale split.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from fedrecgel_secure.data.authors import authors_holdout, authors_ids, authors_protocol
from fedrecgel_secure.data.loaders import DATASETS, read_interactions, resolve_dataset
from fedrecgel_secure.data.split import Split, prepare_split
from fedrecgel_secure.data.synthetic import SHAPES, shape_interactions
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.runs.checkpoint import atomic_write_bytes

PREP_VERSION = 3  # bump when prepare_split or authors_protocol changes what it produces (3: #27)


def default_cache_dir() -> Path:
    root = os.environ.get("FEDRECGEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")), "fedrecgel-secure"
    )
    return Path(root)


def dataset_format(name: str, protocol: str = "clean") -> str | None:
    """The default format of a registered dataset under a protocol (the authors read LastFM-2K differently)."""
    info = DATASETS.get(name)
    if info is None:
        return None
    return (info.authors_fmt or info.fmt) if protocol == "authors" else info.fmt


def resolve_source(data) -> tuple[Path, str]:
    """The file and format a data policy points at."""
    protocol = getattr(data, "protocol", "clean")
    if data.path is not None:
        info = DATASETS.get(data.dataset)
        if info is None or info.bundled:
            # data.path replaces a bundled dataset (the default's FilmTrust): the file is another dataset, so its
            # format comes from its own name, as for data.dataset = PATH, never from the dataset it replaces.
            return resolve_dataset(data.path, data.format)
        return resolve_dataset(data.path, data.format or dataset_format(data.dataset, protocol))
    return resolve_dataset(data.dataset, data.format or dataset_format(data.dataset, protocol))


def authors_data(data):
    """The authors' protocol applied to the file a data policy points at (:mod:`.authors`)."""
    path, fmt = resolve_source(data)
    raw = read_interactions(path, fmt)
    return authors_protocol(
        raw,
        authors_holdout(fmt, raw),
        ids=authors_ids(fmt),
        min_interactions=data.min_interactions,
        test_negatives=data.test_negatives,
        seed=data.seed,
    )


def load_split(data, *, use_cache: bool = True) -> Split:
    if data.path is None and data.dataset in SHAPES:
        return shape_split(data)
    path, fmt = resolve_source(data)
    params = dict(
        fmt=fmt,
        min_interactions=data.min_interactions,
        test_negatives=data.test_negatives,
        validation=data.validation,
        seed=data.seed,
        protocol=data.protocol,
        version=PREP_VERSION,
    )
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")  # streamed: a 500 MB file is not held twice
    digest.update(json.dumps(params, sort_keys=True).encode())
    cache = Path(data.cache_dir) if data.cache_dir else default_cache_dir()
    cached = cache / f"{path.stem}-{digest.hexdigest()[:20]}.npz"
    if use_cache and cached.is_file():
        try:
            with np.load(cached) as arrays:
                return Split.from_arrays(dict(arrays))
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry is rebuilt below
    split = authors_data(data).to_split() if data.protocol == "authors" else _clean_split(data, path, fmt)
    if use_cache:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            np.savez(buffer, **split.to_arrays())
            atomic_write_bytes(cached, buffer.getvalue())
        except OSError:
            pass  # a read-only cache costs time, never correctness
    return split


def _clean_split(data, path: Path, fmt: str) -> Split:
    return prepare_split(
        read_interactions(path, fmt),
        min_interactions=data.min_interactions,
        test_negatives=data.test_negatives,
        validation=data.validation,
        seed=data.seed,
    )


def shape_split(data, scale: float = 1.0) -> Split:
    """The split of a shape-only dataset (:data:`~fedrecgel_secure.data.synthetic.SHAPES`), drawn from data.seed;
    not cached: drawing it is as fast as reading a cached copy back."""
    if data.protocol == "authors":
        raise BadInputError(f"data.dataset = {data.dataset!r} is synthetic; data.protocol must be 'clean'")
    return prepare_split(
        shape_interactions(data.dataset, scale=scale, seed=data.seed),
        min_interactions=data.min_interactions,
        test_negatives=data.test_negatives,
        validation=data.validation,
        seed=data.seed,
    )
