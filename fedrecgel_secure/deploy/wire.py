"""Arrays as bytes in Flower records: ``np.save`` without pickles, so a reply cannot carry code."""

from __future__ import annotations

import io
import json

import numpy as np


def pack(arr) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(arr), allow_pickle=False)
    return buffer.getvalue()


def unpack(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def pack_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


def unpack_json(data: bytes):
    return json.loads(data.decode())
