"""A node's side of the masking protocol: its users' :class:`MaskingClient` roles, one stage per call.

Each user of the node's shard is one protocol client. Every call may run in a
fresh process (Flower starts one per message), so everything lives in the
node's state directory, under ``secagg/``:

``user-U.pem``      user U's Ed25519 identity key (made here, 0600, never sent; only its public key is)
``session.json``    the session's public facts: server key, session tag, every client's public key
``attempt-U.json``  user U's secrets of the current attempt and the last round it confirmed (0600,
                    :mod:`.masking_client_state`); a new session drops the attempt and keeps the round
``inputs-R.npz``    the vectors the node's users of round R will mask (0600; written by the train stage;
                    a user's row goes once it confirmed round R, the file once no row is left)

One sum per round: a user masks only the input of the round that the server's
signed announcement of the attempt names (never a round a payload field names),
and refuses every attempt of a round it confirmed, in this session or an earlier
one. So a server cannot relabel a released round's inputs for a new attempt, nor
reopen a released round with a new session, to difference two sums over
different sets down to one user's upload.

A stage takes the aggregator's message per user and returns each user's reply,
or the reason the user refused it (:class:`ProtocolViolation`: that user drops
out, exactly as in :class:`~fedrecgel_secure.privacy.secagg.session.SecAggSession`);
the masked stage returns one group instead of a masked vector per user: their
sum, signed by each user it lists (:meth:`MaskingNode._masked`). ``stage.lock``
makes the node answer one stage message at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from fedrecgel_secure.deploy.messages import SESSION_TAG, StageResult, user_keys
from fedrecgel_secure.deploy.node.masking_client_state import end_attempt, load_attempt, save_attempt
from fedrecgel_secure.deploy.node.users import UserIdentities
from fedrecgel_secure.deploy.schemes import Setup
from fedrecgel_secure.privacy.secagg.errors import Reason, RejectedPayload
from fedrecgel_secure.privacy.secagg.identity import IdentityDirectory
from fedrecgel_secure.privacy.secagg.keys import write_private_file
from fedrecgel_secure.privacy.secagg.masking.client import MaskingClient
from fedrecgel_secure.privacy.secagg.masking.wire import encode_group, group_statement

STAGES = ("advertise", "share", "masked", "confirm", "unmask")
log = logging.getLogger("fedrecgel_secure.deploy")
# round, user ids -> (vector, DP noise share or None) of those users that hold an input of that round; called in
# the "masked" stage only, with the round of each user's signed announcement
Inputs = Callable[[int, list[int]], Mapping[int, tuple[np.ndarray, "np.ndarray | None"]]]


class MaskingNode(UserIdentities):
    def __init__(self, state_dir: Path, users: list[int], setup: Setup):
        super().__init__(state_dir, users)
        self.setup = setup

    def join(self, server_key: bytes, session_tag: bytes, directory: Mapping[int, bytes]) -> None:
        """Record the session the server announces; refuse one that misstates this node's own users' keys."""
        self.check(directory)
        facts = {
            "server_key": server_key.hex(),
            "session_tag": session_tag.hex(),
            "directory": {str(u): k.hex() for u, k in directory.items()},
        }
        write_private_file(self.dir / "session.json", json.dumps(facts, sort_keys=True).encode())
        for path in self.dir.glob("attempt-*.json"):
            end_attempt(path)  # nothing of an old session's attempt may continue; its confirmed rounds stay closed

    # -- the scheme table's node role (:mod:`fedrecgel_secure.deploy.schemes`) --------------------------
    def keys_reply(self) -> dict:
        """The ``keys`` set-up stage: each user's public identity key."""
        return user_keys(self.public_keys())

    def join_session(self, request: Mapping, directory: Mapping[int, bytes]) -> None:
        """The ``join`` set-up stage: the server's signing key and session tag, and every user's key."""
        self.join(request["server_key"], request[SESSION_TAG], directory)

    def train_reply(self, round_idx: int, clients, vectors, shares, sampled: int | None, request: Mapping) -> dict:
        """What the train reply carries for masking: no vector (they stay here until the masked stage) but the
        round's first protocol stage, the sampled users' adverts."""
        from fedrecgel_secure.deploy.messages import reply, train_binding

        self.keep_inputs(round_idx, clients, vectors, shares, sampled)
        # only an announcement of the round trained (the inputs are kept for that round alone), and bound to the
        # model and settings this node was sent: users sent another model than their peers get no sum
        binding = train_binding(request["shared"], request.get("participants"), request.get("clip_norm"))
        announced = dict.fromkeys(clients.tolist(), request["announce"])
        return reply(self.step("advertise", announced, round_idx=round_idx, binding=binding))

    def _client(self, user: int) -> MaskingClient:
        facts = json.loads((self.dir / "session.json").read_text())
        directory = IdentityDirectory({int(u): bytes.fromhex(k) for u, k in facts["directory"].items()})
        s = self.setup
        client = MaskingClient(
            self.identity(user),
            directory,
            s.dim,
            s.params,
            server_key=bytes.fromhex(facts["server_key"]),
            encoding=s.encoding,
            min_clients=s.min_clients,
            session_tag=bytes.fromhex(facts["session_tag"]),
        )
        load_attempt(client, self.dir / f"attempt-{user}.json")
        return client

    def keep_inputs(
        self,
        round_idx: int,
        clients: np.ndarray,
        vectors: np.ndarray,
        shares: np.ndarray | None,
        sampled: int | None = None,
    ) -> None:
        """Keep the sampled ``clients``' vectors of round ``round_idx`` (and their DP noise shares) for the masked
        stage: the node's :meth:`Node.protect`, what the simulator's :class:`SecureSum` hands the protocol.
        ``sampled``: the sample size the shares were sized for, which the round's cohort may not exceed."""
        for old in self.dir.glob("inputs-*.npz"):
            old.unlink()
        extra = {} if shares is None else {"shares": shares}
        if sampled is not None:  # one per row, so that forgetting rows keeps it
            extra["sampled"] = np.full(len(clients), sampled, dtype=np.int64)
        arrays = {"clients": np.asarray(clients, dtype=np.int64), "vectors": vectors, **extra}
        self._write_inputs(self.dir / f"inputs-{round_idx}.npz", arrays)

    @staticmethod
    def _write_inputs(path: Path, arrays: dict[str, np.ndarray]) -> None:
        import io

        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_private_file(path, buffer.getvalue())

    def inputs(self, round_idx: int, users: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
        """The inputs :meth:`keep_inputs` kept for round ``round_idx``, of those ``users`` that have one."""
        path = self.dir / f"inputs-{round_idx}.npz"
        if not path.exists():
            return {}
        with np.load(path, allow_pickle=False) as data:
            row = {int(c): i for i, c in enumerate(data["clients"].tolist())}
            vectors = data["vectors"]
            shares = data.get("shares")
            return {u: (vectors[row[u]], None if shares is None else shares[row[u]]) for u in users if u in row}

    def sampled(self, round_idx: int) -> int | None:
        """The sample size round ``round_idx``'s noise shares were sized for (:meth:`keep_inputs`), if kept."""
        path = self.dir / f"inputs-{round_idx}.npz"
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as data:
            return int(data["sampled"][0]) if "sampled" in data.files and data["sampled"].size else None

    def _forget_inputs(self, confirmed: Mapping[int, int]) -> None:
        """Remove the inputs of users that confirmed their round (``confirmed``: user -> last confirmed round): a
        confirmed round is never masked again, so its inputs have no further use."""
        for path in self.dir.glob("inputs-*.npz"):
            round_idx = int(path.stem.split("-", 1)[1])
            with np.load(path, allow_pickle=False) as data:
                done = np.array([confirmed.get(int(c), -1) >= round_idx for c in data["clients"].tolist()])
                if not done.any():
                    continue  # the vectors are read only when a row goes
                kept = {k: data[k][~done] for k in data.files}
            if done.all():
                path.unlink()
            else:
                self._write_inputs(path, kept)

    def step(
        self,
        stage: str,
        messages: Mapping[int, bytes],
        inputs: Inputs | None = None,
        *,
        round_idx: int | None = None,
        binding: bytes = b"",
    ) -> StageResult:
        """Run ``stage`` for every user addressed in ``messages`` (all of them this node's users).

        ``inputs``: where the masked stage finds each user's input of its attempt's round (:meth:`inputs` by
        default). ``round_idx`` (advertise only, which comes with the train message alone): the round the node
        trained; a user refuses an announcement of any other round; ``binding``: the digest of the model it was
        trained on (:func:`~fedrecgel_secure.deploy.messages.train_binding`), which the attempt is bound to.
        Masked stage: a user whose signed cohort is larger than the sample its DP noise share was sized for
        (:meth:`sampled`), or smaller, refuses to upload: the server misstated the sample, so the shares would
        not add up to the planned noise.
        """
        if stage not in STAGES:
            raise ValueError(f"unknown masking stage {stage!r}")
        if stage == "advertise" and round_idx is None:
            # an attempt starts only with the train message that trains its round, bound to the model it carries
            # (:meth:`train_reply`); a standalone advertise stage would start one over the inputs kept from that
            # train stage, bound to nothing, after the server sent other nodes another model (issue 35, finding 2)
            raise ValueError("a masking attempt starts only with its round's train message")
        strangers = sorted(set(messages) - set(self.users))
        if strangers:
            raise ValueError(f"users {strangers[:10]} are not hosted by this node")
        with self._one_stage_at_a_time():
            return self._step(stage, messages, inputs, round_idx, binding)

    @contextlib.contextmanager
    def _one_stage_at_a_time(self):
        """Hold the node's stage lock: two messages answered at once (two ``flwr-clientapp`` processes) would both
        read a user's attempt before either wrote it, and so could both mask, seal or confirm once."""
        fd = os.open(self.dir / "stage.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _step(self, stage, messages, inputs, round_idx, binding) -> StageResult:
        users = sorted(messages)
        clients = {u: self._client(u) for u in users}
        if stage == "masked":
            out = self._masked(clients, messages, inputs or self.inputs)
        else:
            out = StageResult({}, {})
            for u in users:
                client = clients[u]
                try:
                    if stage == "advertise":
                        reply = client.advertise(messages[u], expect_round=round_idx, binding=binding)
                    elif stage == "share":
                        reply = client.share_keys(messages[u])
                    elif stage == "confirm":
                        reply = client.confirm(messages[u])
                    else:
                        reply = client.unmask(messages[u])
                    out.replies[u] = reply
                except RejectedPayload as exc:
                    out.refused[u] = exc.reason.value
        for u, client in clients.items():
            save_attempt(client, self.dir / f"attempt-{u}.json")
        self._forget_inputs({u: c.confirmed_round for u, c in clients.items()})
        return out

    def _masked(self, clients: Mapping[int, MaskingClient], messages: Mapping[int, bytes], inputs: Inputs):
        """The masked stage: each user masks its input once (:meth:`MaskingClient.mask`), and the node sends ONE
        group, the sum of those masked inputs, signed by every user it lists (:meth:`MaskingClient.seal_group`).

        The node holds its users' inputs anyway, so their sum gives the server strictly less than their masked
        inputs one by one (it could add those up itself), at one vector per node instead of one per user. Each
        user masks and seals once per attempt (also across messages: the attempt file records it), so two groups
        of one node that differ by a user (the sum of A minus the sum of A without u is u's masked input) cannot
        both exist. Users of another attempt than most of the message's users refuse (``inconsistent``): a group
        is of one attempt. A user refusing here drops out, as in :class:`SecAggSession`.
        """
        # the attempt of most of the message's users (the first user's on a tie): a group is of one attempt
        contexts = Counter(c._round.context for _, c in sorted(clients.items()) if c._round is not None)
        attempt = contexts.most_common(1)[0][0] if contexts else None
        vectors, samples = {}, {}
        by_round: dict[int, list[int]] = {}
        for u, client in clients.items():
            if client.attempt_round is not None:
                by_round.setdefault(client.attempt_round, []).append(u)
        for r, some in by_round.items():
            vectors.update(inputs(r, some))
            samples[r] = self.sampled(r)
        out, masked = StageResult({}, {}), {}
        for u, client in sorted(clients.items()):
            try:
                if client._round is not None and client._round.context != attempt:
                    raise client.abort(Reason.INCONSISTENT, "one message holds inboxes of two attempts")
                if u not in vectors and client.attempt_round is not None:
                    raise client.abort(Reason.OUT_OF_PHASE, f"no input of round {client.attempt_round}")
                sampled = None if client.attempt_round is None else samples.get(client.attempt_round)
                if sampled is not None and len(client.cohort) > sampled:
                    raise client.abort(
                        Reason.INCONSISTENT, f"a cohort of {len(client.cohort)} users, but {sampled} were sampled"
                    )
                x, noise = vectors.get(u, (None, None))
                if sampled is not None and noise is not None and len(client.cohort) < sampled:
                    # shares sized for more users than signed in: the sum would carry less than the planned
                    # noise (a server sampling a few and stating a large sample); the round is skipped instead
                    raise client.abort(
                        Reason.INCONSISTENT,
                        f"noise shares sized for {sampled} sampled users, but the cohort has {len(client.cohort)}",
                    )
                masked[u] = client.mask(messages[u], x, noise)
                out.clipped += client.last_clipped
            except RejectedPayload as exc:
                out.refused[u] = exc.reason.value
        if out.clipped:  # a range too small for these vectors: the operator's to see, not the server's
            log.warning("masked stage: the grid clipped %d values of this node's users' inputs", out.clipped)
        if masked:
            total = np.zeros(self.setup.dim, dtype=np.uint64)
            for y in masked.values():
                total += y  # mod 2^64, the protocol's ring
            statement = group_statement(clients[min(masked)].attempt_round, sorted(masked), total)
            signatures = []
            for u in sorted(masked):
                try:
                    signatures.append(clients[u].seal_group(statement))
                except RejectedPayload as exc:  # not with the checks above; the group then goes unsent
                    out.refused.update(dict.fromkeys(masked, exc.reason.value))
                    return out
            out.group = encode_group(statement, signatures)
        return out
