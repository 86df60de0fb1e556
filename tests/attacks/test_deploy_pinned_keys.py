"""Attacks of a server that lies about keys (issue 45): it swaps the key holder's public keys, or invents users.

The attacker is the server: the real ServerApp over the in-process grid, the real nodes and key holder, their
messages changed on the way (:class:`TamperingGrid`). Before, every key of the set-up reached the nodes and the key
holder through the server, unsigned. Now each node and the key holder take the directory only as the nodes signed
it, and the key holder's sealing key (DPF) or public context (BFV) only as the key holder signed it, under the
identity keys their own policies pin (:mod:`fedrecgel_secure.deploy.node.pinned`; the grid pins them as
``deploy local`` does).

1. DPF: the server puts its own X25519 key in place of the key holder's sealing key; with its own, it would open
   both boxes of every upload (before: it opened the key holder's box of every upload).
2. BFV: the server puts a public context of its own (whose secret key it holds) in place of the key holder's; the
   nodes would encrypt their partial sums to it (before: every node did).
3. Sybils: the server invents users in the directory (with keys it holds), so that an honest user is alone among
   them in a cohort, or so that it can pose as users to the key holder (before: every masking node, and the BFV
   and DPF key holders, took them). Under BFV and DPF the key holder, asked first, refuses; the nodes' check is
   the same code (:meth:`Pins.directory`), which the masking case plays.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from helpers.deploy import BFV, MASKING, write_deploy_policy
from helpers.malicious import TamperingGrid

DPF = BFV.replace("bfv", "dpf")
SYBILS = [900, 901, 902]  # user ids no node hosts


class Spy(TamperingGrid):
    """The tampering grid, keeping every reply the server pulls (what the attacker gets to open)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pulled: list[dict] = []

    def pull_messages(self, message_ids):
        from fedrecgel_secure.deploy.wire import from_record

        replies = super().pull_messages(message_ids)
        self.pulled += [from_record(r.content) for r in replies if not r.has_error()]
        return replies


def _refused_as_unsigned(grid: Spy) -> bool:
    """Whether a node or the key holder refused the set-up as not signed under its pins (``bad_signature``)."""
    errors = any("bad_signature" in why for _, why in grid.refusals)
    return errors or any(reply.get("refused") == "bad_signature" for reply in grid.pulled)


def _run(tmp_path: Path, section: str, tamper) -> tuple[Spy, Path, Path]:
    """One round of ``section``'s scheme, the server's messages changed by ``tamper``; the grid and its dirs."""
    from fedrecgel_secure.deploy.server.serverapp import run_server

    policy_file = write_deploy_policy(tmp_path, section, 1, 3, timeout=1.0, heartbeat=0.05)
    out = tmp_path / "deployed"
    nodes = [out / "nodes" / str(s) for s in range(3)]
    grid = Spy(policy_file, nodes, None, out / "nodes" / "keyholder", tamper=tamper)
    try:
        run_server(grid, policy_file, out, resume=False, catalogue=grid.catalogue)
    except RuntimeError as exc:  # the set-up failed: the nodes refused to join
        print(f"the server's run stopped: {exc}")
    return grid, out, policy_file


def test_a_server_swapping_the_dpf_key_holders_sealing_key_opens_no_box(tmp_path):
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from fedrecgel_secure.deploy.messages import DPF_UPLOAD
    from fedrecgel_secure.privacy.secagg.dpf.wire import _HEAD as HEAD
    from fedrecgel_secure.privacy.secagg.dpf.wire import box_info, split_upload, suite
    from fedrecgel_secure.privacy.secagg.identity import Envelope

    mine = X25519PrivateKey.generate()
    tags: list[bytes] = []

    def swap_the_sealing_key(group: str, payload: dict) -> bool:
        if payload.get("stage") != "join":
            return False
        keys = bytes(payload["seal_keys"])  # the server's, then the key holder's
        payload["seal_keys"] = keys[:32] + mine.public_key().public_bytes_raw()
        tags.append(bytes(payload["session_tag"]))
        return True

    grid, _, _ = _run(tmp_path, DPF, swap_the_sealing_key)
    opened = tried = 0
    for reply in grid.pulled:
        for field, upload in reply.items():
            if not field.startswith(DPF_UPLOAD):
                continue
            env = Envelope.parse(split_upload(bytes(upload))[0])
            box_len = HEAD.unpack_from(env.body)[-1]  # the key holder's box follows the header
            box = bytes(env.body[HEAD.size : HEAD.size + box_len])
            tried += 1
            try:
                suite().decrypt(box, mine, info=box_info(tags[0], env.round_idx, env.client_id, 1))
                opened += 1
            except Exception:
                pass
    print(f"the server opened the key holder's box of {opened} of {tried} uploads; refusals: {grid.refusals}")
    assert opened == 0 and tried == 0 and _refused_as_unsigned(grid)


def test_a_server_swapping_the_bfv_public_context_gets_nothing_encrypted_to_it(tmp_path):
    from fedrecgel_secure.deploy.node.bfv_node import KeyHolderNode
    from fedrecgel_secure.deploy.schemes import setup_of
    from fedrecgel_secure.policy import load_policy

    mine: list[bytes] = []

    def swap_the_context(group: str, payload: dict) -> bool:
        if payload.get("stage") != "join":
            return False
        if not mine:  # a key holder of the server's own, whose secret key it holds
            setup = setup_of(load_policy(tmp_path / "policy.toml"), int(payload["dim"]))
            mine.append(KeyHolderNode(tmp_path / "server-keys", setup).start({}, b"s" * 16, {}, {})[0])
        payload["context"] = mine[0]
        return True

    grid, out, _ = _run(tmp_path, BFV, swap_the_context)
    under_mine = [
        s
        for s in range(3)
        if (f := out / "nodes" / str(s) / "secagg" / "he.json").exists()
        and bytes.fromhex(json.loads(f.read_text())["context"]) == mine[0]
    ]
    partials = sum("partial" in reply for reply in grid.pulled)
    print(f"nodes that took the server's context: {under_mine}; partial sums sent: {partials}; {grid.refusals}")
    assert under_mine == [] and partials == 0 and _refused_as_unsigned(grid)


def _sybil_entries(payload: dict, attacker: Path) -> None:
    """The server's directory with users of its own: old-style ``k:U`` keys, and node 0's entry re-signed by the
    only identity key the server has, its own, with the Sybils in it."""
    from fedrecgel_secure.privacy.secagg.identity import ClientIdentity, Envelope

    sybils = {f"k:{u}": ClientIdentity.generate(u).public_bytes for u in SYBILS}
    payload.update(sybils)
    if "e:0" in payload:  # node 0's signed entry (deploy.messages.ENTRY_OF)
        from fedrecgel_secure.deploy.node.pinned import sign_entry

        body = json.loads(bytes(Envelope.parse(bytes(payload["e:0"])).body))
        honest = {name: bytes.fromhex(v) for name, v in body["keys"].items()}
        payload["e:0"] = sign_entry(attacker, 0, str(payload.get("digest", "")), {**honest, **sybils})


@pytest.mark.parametrize("section", [MASKING, BFV, DPF], ids=["masking", "bfv", "dpf"])
def test_a_server_inventing_users_in_the_directory_is_refused(tmp_path, section):
    def invent_users(group: str, payload: dict) -> bool:
        if payload.get("stage") not in ("join", "start"):
            return False
        _sybil_entries(payload, tmp_path / "attacker")
        return True

    grid, out, _ = _run(tmp_path, section, invent_users)
    took = {}
    files = {"masking": "secagg/session.json", "bfv": "session.json", "dpf": "dpf-session.json"}
    for who in ["0", "1", "2", "keyholder"]:
        for name in files.values():
            f = out / "nodes" / who / name
            if f.exists():
                directory = json.loads(f.read_bytes()).get("directory", {})
                took[who] = sorted(int(u) for u in directory if int(u) in SYBILS)
    print(f"Sybils each party took into its directory: {took}; refusals: {grid.refusals}")
    assert all(not sybils for sybils in took.values()) and _refused_as_unsigned(grid)
