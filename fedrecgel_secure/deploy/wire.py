"""The messages' payloads as Flower records, read by the server and the nodes alike: arrays as bytes by
``np.save`` without pickles (so a reply cannot carry code), dicts as sorted JSON."""

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


def to_record(payload: dict):
    """A payload of arrays, ints, strings and JSON-able dicts as one Flower RecordDict."""
    from flwr.app import ConfigRecord, RecordDict

    cfg = {}
    for k, v in payload.items():
        if isinstance(v, np.ndarray):
            cfg["a:" + k] = pack(v)
        elif isinstance(v, dict):
            cfg["j:" + k] = pack_json(v)
        else:
            cfg[k] = v
    return RecordDict({"payload": ConfigRecord(cfg)})


def from_record(content) -> dict:
    out = {}
    for k, v in content["payload"].items():
        if k.startswith("a:"):
            out[k[2:]] = unpack(v)
        elif k.startswith("j:"):
            out[k[2:]] = unpack_json(v)
        else:
            out[k] = v
    return out
