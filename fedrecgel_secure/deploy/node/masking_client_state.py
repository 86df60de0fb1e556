"""A masking client's attempt secrets on disk, so each stage can run in a fresh ``flwr-clientapp`` process.

:class:`~fedrecgel_secure.privacy.secagg.masking.client.MaskingClient` keeps
its attempt (X25519 keys, self-mask seed, held shares, survivor set) in memory.
A node runs every stage in a new process, so between stages that attempt is
written to one 0600 file per user and read back by the next stage. The file is
as secret as the identity key: whoever reads it can strip the user's masks.
An aborted attempt (the client raised a violation) is written as "no attempt",
so a later stage finds nothing to continue, as in memory. The file also holds
the last round the user confirmed; it outlives the attempt and the session
(:func:`end_attempt`), so no later attempt, of any session, reopens that round.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedrecgel_secure.privacy.secagg.keys import read_private_file, write_private_file
from fedrecgel_secure.privacy.secagg.masking.client import MaskingClient, _ClientRound


def _hex_map(d: dict[int, bytes]) -> dict[str, str]:
    return {str(k): v.hex() for k, v in d.items()}


def _dump(st: _ClientRound | None) -> dict | None:
    if st is None:
        return None
    return {
        "round_idx": st.round_idx,
        "round_seed": st.round_seed.hex(),
        "c_key": st.c_key.private_bytes_raw().hex(),
        "s_key": st.s_key.private_bytes_raw().hex(),
        "b_seed": st.b_seed.hex(),
        "cohort": list(st.cohort),
        "digest": st.digest.hex(),
        "neighbours": list(st.neighbours),
        "t": st.t,
        "c_shared": _hex_map(st.c_shared),
        "s_shared": _hex_map(st.s_shared),
        "held": {str(k): [str(b), str(s)] for k, (b, s) in st.held.items()},
        "sealed": st.sealed,
        "survivors": None if st.survivors is None else list(st.survivors),
        "answered": st.answered,
        "context": st.context.hex(),
    }


def _restore(d: dict | None) -> _ClientRound | None:
    if d is None:
        return None
    return _ClientRound(
        round_idx=int(d["round_idx"]),
        round_seed=bytes.fromhex(d["round_seed"]),
        c_key=X25519PrivateKey.from_private_bytes(bytes.fromhex(d["c_key"])),
        s_key=X25519PrivateKey.from_private_bytes(bytes.fromhex(d["s_key"])),
        b_seed=bytes.fromhex(d["b_seed"]),
        cohort=tuple(int(c) for c in d["cohort"]),
        digest=bytes.fromhex(d["digest"]),
        neighbours=tuple(int(c) for c in d["neighbours"]),
        t=int(d["t"]),
        c_shared={int(k): bytes.fromhex(v) for k, v in d["c_shared"].items()},
        s_shared={int(k): bytes.fromhex(v) for k, v in d["s_shared"].items()},
        held={int(k): (int(b), int(s)) for k, (b, s) in d["held"].items()},
        sealed=bool(d.get("sealed", d["held"])),  # a file from before the flag: a masked input counts as sent
        survivors=None if d["survivors"] is None else tuple(int(c) for c in d["survivors"]),
        answered=bool(d["answered"]),
        context=bytes.fromhex(d["context"]),
    )


def save_attempt(client: MaskingClient, path: Path) -> None:
    """Write ``client``'s attempt and its last confirmed round to ``path`` (0600, replaced atomically)."""
    _write(path, client.confirmed_round, _dump(client._round))


def end_attempt(path: Path) -> None:
    """Drop the attempt saved at ``path`` (a new session starts) but keep the last round the user confirmed."""
    if path.exists():
        _write(path, int(json.loads(read_private_file(path).decode())["confirmed"]), None)


def _write(path: Path, confirmed: int, attempt: dict | None) -> None:
    data = json.dumps({"confirmed": confirmed, "round": attempt}).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    write_private_file(tmp, data)
    tmp.replace(path)


def load_attempt(client: MaskingClient, path: Path) -> None:
    """Put the attempt saved at ``path`` (if any) back into a freshly built ``client``."""
    if not path.exists():
        return
    d = json.loads(read_private_file(path).decode())
    client._confirmed_round = int(d["confirmed"])
    client._round = _restore(d["round"])
