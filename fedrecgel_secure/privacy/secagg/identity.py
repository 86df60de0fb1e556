"""Client identities and the signed envelope every upload travels in.

Each client holds a long-term Ed25519 key; the aggregator and the key holder
know the public halves (an :class:`IdentityDirectory`). Every message a client
sends is an envelope::

    offset  size  field
    0       4     magic  b"FRSA"
    4       1     version (1)
    5       1     kind   (:class:`Kind`)
    6       2     reserved, must be 0
    8       8     round index, u64 big-endian
    16      4     client id, u32 big-endian
    20      4     body length L, u32 big-endian
    24      L     body
    24+L    64    Ed25519 signature

The signature covers ``DOMAIN || len(context) || context || kind || round ||
client id || SHA-256(body)``. The aggregator signs its own messages to the
clients (masking protocol) the same way with a :class:`ServerIdentity`, under
``SERVER_DOMAIN`` and sender id 0, so that no client signature ever verifies
as a server message or the other way round, even for a client whose id is 0.
``context`` is agreed out of band (a session tag, plus the round nonce for the
masking protocol), so an envelope cannot be moved between deployments,
protocol steps or attempts of a round. Signing the body's
hash rather than the body lets the aggregator forward a compact proof of each
contribution (client id, hash, signature) to the HE key holder.

The order of checks is fixed so that rejection reasons are predictable: layout
(``truncated``/``garbage``), kind, known client, round (``replay`` if at or
before the last completed round, else ``wrong_round``), signature. Cheap checks
come first so a flood of junk costs no signature verifications.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedrecgel_secure.errors import BadInputError

from .errors import KeyFileError, Reason, RejectedPayload
from .keys import read_private_file, write_private_file

MAGIC = b"FRSA"
VERSION = 1
DOMAIN = b"fedrecgel-secagg/v1/envelope\x00"
SERVER_DOMAIN = b"fedrecgel-secagg/v1/server\x00"
SERVER_ID = 0
HEADER = struct.Struct(">4sBBHQII")
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32
MAX_CLIENT_ID = 2**32 - 1
MAX_ROUND = 2**64 - 1


class Kind(IntEnum):
    """Message type; part of the signed data so one step's message never passes for another's."""

    HE_UPLOAD = 1
    MASK_ADVERTISE = 2
    MASK_SHARES = 3
    MASK_INPUT = 4
    MASK_UNMASK = 5
    # Signed by the aggregator (ServerIdentity) and checked by the masking clients:
    MASK_ANNOUNCE = 6  # round index and fresh round seed
    MASK_COHORT = 7  # key broadcast: the cohort's signed adverts
    MASK_INBOX = 8  # one client's encrypted shares
    MASK_CHECK = 9  # survivor set U3, for the consistency check
    MASK_CONFIRM = 10  # signed by a masking client: its signature on (cohort, U3)
    MASK_REQUEST = 11  # unmask request: U3 and the forwarded confirmations
    # Signed by a deployed node's identity key (deploy/node/hello.py): who it is, over the server's nonce
    NODE_HELLO = 12
    # Signed by a masking client: its seal over a group statement (the sum of its host's users' masked inputs)
    MASK_GROUP = 13
    # Signed by a client of the two-server DPF scheme: its keys for both servers (privacy/secagg/dpf/wire.py)
    DPF_UPLOAD = 14
    # Signed by a deployed node's identity key: the public keys of its keys reply, its entry of the identity directory
    NODE_KEYS = 15
    # Signed by the key holder's identity key: its public set-up material (DPF sealing key, BFV public context)
    KEY_HOLDER_PUBLIC = 16


SERVER_KINDS = frozenset({Kind.MASK_ANNOUNCE, Kind.MASK_COHORT, Kind.MASK_INBOX, Kind.MASK_CHECK, Kind.MASK_REQUEST})


def check_client_id(client_id: int) -> int:
    if isinstance(client_id, bool) or not isinstance(client_id, int) or not 0 <= client_id <= MAX_CLIENT_ID:
        raise BadInputError(f"client id must be an integer in [0, 2**32 - 1], got {client_id!r}")
    return client_id


def check_round(round_idx: int) -> int:
    if isinstance(round_idx, bool) or not isinstance(round_idx, int) or not 0 <= round_idx <= MAX_ROUND:
        raise BadInputError(f"round index must be an integer in [0, 2**64 - 1], got {round_idx!r}")
    return round_idx


SESSION_TAG_MIN_BYTES = 16


def check_session_tag(tag: bytes) -> bytes:
    """A deployment's session tag: at least 16 random bytes, so that no message of one deployment verifies in
    another."""
    if not isinstance(tag, (bytes, bytearray)) or not SESSION_TAG_MIN_BYTES <= len(tag) <= 1024:
        raise BadInputError(
            f"session_tag must be {SESSION_TAG_MIN_BYTES} to 1024 bytes (draw it with secrets.token_bytes),"
            f" got {tag!r:.40}"
        )
    return bytes(tag)


def signed_message(
    context: bytes, kind: int, round_idx: int, client_id: int, digest: bytes, domain: bytes = DOMAIN
) -> bytes:
    return b"".join(
        (domain, struct.pack(">H", len(context)), context, struct.pack(">BQI", kind, round_idx, client_id), digest)
    )


@dataclass(frozen=True)
class Envelope:
    kind: int
    round_idx: int
    client_id: int
    body: bytes | memoryview
    signature: bytes

    @cached_property
    def digest(self) -> bytes:
        return hashlib.sha256(self.body).digest()

    def to_bytes(self) -> bytes:
        header = HEADER.pack(MAGIC, VERSION, self.kind, 0, self.round_idx, self.client_id, len(self.body))
        return b"".join((header, self.body, self.signature))

    @classmethod
    def parse(cls, data: bytes, *, zero_copy: bool = False) -> Envelope:
        """Split bytes into an envelope; checks layout only, not the signature.

        With ``zero_copy`` the body is a memoryview into ``data``, which saves a
        copy of multi-megabyte uploads.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise RejectedPayload(Reason.GARBAGE, f"payload must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < HEADER.size + SIGNATURE_BYTES:
            raise RejectedPayload(Reason.TRUNCATED, f"{len(data)} bytes is shorter than an empty envelope")
        magic, version, kind, reserved, round_idx, client_id, length = HEADER.unpack_from(data)
        if magic != MAGIC or reserved != 0:
            raise RejectedPayload(Reason.GARBAGE, "not a secure-aggregation envelope (bad magic)")
        if version != VERSION:
            raise RejectedPayload(Reason.GARBAGE, f"unsupported envelope version {version}", client_id)
        expected = HEADER.size + length + SIGNATURE_BYTES
        if len(data) < expected:
            raise RejectedPayload(Reason.TRUNCATED, f"{len(data)} bytes, header announces {expected}", client_id)
        if len(data) > expected:
            raise RejectedPayload(Reason.GARBAGE, f"{len(data) - expected} trailing bytes", client_id)
        source = memoryview(data) if zero_copy else data
        body = source[HEADER.size : HEADER.size + length]
        return cls(kind, round_idx, client_id, body, data[HEADER.size + length :])


@dataclass(frozen=True)
class ContributionProof:
    """What the key holder needs to check that a client really contributed to a round."""

    client_id: int
    digest: bytes
    signature: bytes

    SIZE = 4 + DIGEST_BYTES + SIGNATURE_BYTES

    def to_bytes(self) -> bytes:
        return struct.pack(">I", self.client_id) + self.digest + self.signature

    @classmethod
    def parse(cls, data: bytes) -> ContributionProof:
        if len(data) != cls.SIZE:
            raise RejectedPayload(Reason.TRUNCATED, f"contribution proof of {len(data)} bytes")
        (client_id,) = struct.unpack_from(">I", data)
        return cls(client_id, data[4 : 4 + DIGEST_BYTES], data[4 + DIGEST_BYTES :])


class ClientIdentity:
    """A client's long-term Ed25519 signing key."""

    domain = DOMAIN

    def __init__(self, client_id: int, private_key: Ed25519PrivateKey) -> None:
        self.client_id = check_client_id(client_id)
        self._key = private_key
        self.public_bytes = private_key.public_key().public_bytes_raw()

    @classmethod
    def generate(cls, client_id: int) -> ClientIdentity:
        return cls(client_id, Ed25519PrivateKey.generate())

    def seal(self, kind: Kind, round_idx: int, body: bytes, context: bytes = b"") -> bytes:
        signature = self.sign(kind, round_idx, hashlib.sha256(body).digest(), context)
        return Envelope(int(kind), round_idx, self.client_id, bytes(body), signature).to_bytes()

    def sign(self, kind: Kind, round_idx: int, digest: bytes, context: bytes = b"") -> bytes:
        """The signature :meth:`seal` puts on a body whose SHA-256 is ``digest``, alone: for a statement that
        travels once with the signatures of several clients (a masking group, :func:`.masking.wire.encode_group`)."""
        check_round(round_idx)
        return self._key.sign(signed_message(context, kind, round_idx, self.client_id, digest, self.domain))

    def save(self, path: str | Path) -> None:
        """Write the private key as unencrypted PKCS#8 PEM to a new 0600 file."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_private_file(path, pem)

    @classmethod
    def load(cls, client_id: int, path: str | Path) -> ClientIdentity:
        data = read_private_file(path)
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"{path}: not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"{path}: expected an Ed25519 key, found {type(key).__name__}")
        return cls(client_id, key)


class ServerIdentity(ClientIdentity):
    """The aggregator's long-term Ed25519 key: signs every aggregator-to-client message of the masking protocol.

    Its signatures are domain-separated from the clients' (``SERVER_DOMAIN``)
    and carry sender id 0; clients check them with
    ``IdentityDirectory.for_server(server.public_bytes)``.
    """

    domain = SERVER_DOMAIN

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        super().__init__(SERVER_ID, private_key)

    @classmethod
    def generate(cls) -> ServerIdentity:  # type: ignore[override]
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | Path) -> ServerIdentity:  # type: ignore[override]
        return cls(ClientIdentity.load(SERVER_ID, path)._key)


class IdentityDirectory:
    """Public identity keys of the clients allowed to take part (or, with ``domain=SERVER_DOMAIN``, of the server)."""

    VERIFIED_CACHE = 8192  # successful verifications remembered, oldest dropped first

    def __init__(self, public_keys: Mapping[int, bytes], *, domain: bytes = DOMAIN) -> None:
        self.domain = bytes(domain)
        self._verified: dict[tuple[int, bytes, bytes], None] = {}
        self._keys: dict[int, Ed25519PublicKey] = {}
        for client_id, raw in public_keys.items():
            check_client_id(client_id)
            try:
                self._keys[client_id] = Ed25519PublicKey.from_public_bytes(bytes(raw))
            except ValueError:
                raise BadInputError(f"public key of client {client_id} is not a 32-byte Ed25519 key") from None

    @classmethod
    def of(cls, identities: Mapping[int, ClientIdentity] | list[ClientIdentity]) -> IdentityDirectory:
        items = identities.values() if isinstance(identities, Mapping) else identities
        return cls({ident.client_id: ident.public_bytes for ident in items})

    @classmethod
    def for_server(cls, public_key: bytes) -> IdentityDirectory:
        """The directory a client checks the aggregator's messages against: the server's key, as sender 0."""
        if not isinstance(public_key, (bytes, bytearray)) or len(public_key) != 32:
            raise BadInputError(
                "server_key must be the server's 32-byte Ed25519 public key (ServerIdentity.public_bytes)"
            )
        return cls({SERVER_ID: bytes(public_key)}, domain=SERVER_DOMAIN)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def client_ids(self) -> list[int]:
        return sorted(self._keys)

    def check_known(self, client_id: int) -> None:
        if client_id not in self._keys:
            raise RejectedPayload(Reason.UNKNOWN_CLIENT, "no identity key registered", client_id)

    def verify(
        self, context: bytes, kind: int, round_idx: int, client_id: int, digest: bytes, signature: bytes
    ) -> None:
        self.check_known(client_id)
        message = signed_message(context, kind, round_idx, client_id, digest, self.domain)
        key = (client_id, bytes(signature), message)
        if key in self._verified:
            return
        try:
            self._keys[client_id].verify(signature, message)
        except InvalidSignature:
            raise RejectedPayload(Reason.BAD_SIGNATURE, "signature does not verify", client_id) from None
        # Verification is deterministic, so a directory shared by the simulated clients of
        # one process (SecAggSession) checks each (key, message, signature) once: in the
        # masking protocol every client checks the same T consistency signatures.
        if self.VERIFIED_CACHE > 0:
            if len(self._verified) >= self.VERIFIED_CACHE:
                self._verified.pop(next(iter(self._verified)))
            self._verified[key] = None


def open_envelope(
    data: bytes,
    *,
    directory: IdentityDirectory,
    kind: Kind,
    round_idx: int,
    completed_round: int,
    context: bytes,
) -> Envelope:
    """Parse and authenticate ``data`` as a ``kind`` message of round ``round_idx``."""
    return authenticate(
        Envelope.parse(data),
        directory=directory,
        kind=kind,
        round_idx=round_idx,
        completed_round=completed_round,
        context=context,
    )


def authenticate(
    env: Envelope,
    *,
    directory: IdentityDirectory,
    kind: Kind,
    round_idx: int,
    completed_round: int,
    context: bytes,
) -> Envelope:
    """Check a parsed envelope's kind, sender, round and signature, in that order."""
    check_header(env, directory=directory, kind=kind, round_idx=round_idx, completed_round=completed_round)
    verify_signature(env, directory=directory, context=context)
    return env


def check_header(
    env: Envelope, *, directory: IdentityDirectory, kind: Kind, round_idx: int, completed_round: int
) -> None:
    """The cheap checks, which need no hashing of the body."""
    if env.kind != kind:
        reason = Reason.WRONG_KIND if env.kind in Kind._value2member_map_ else Reason.GARBAGE
        raise RejectedPayload(reason, f"expected message kind {kind.name}, got {env.kind}", env.client_id)
    directory.check_known(env.client_id)
    if env.round_idx <= completed_round:
        raise RejectedPayload(
            Reason.REPLAY, f"round {env.round_idx} is at or before completed round {completed_round}", env.client_id
        )
    if env.round_idx != round_idx:
        raise RejectedPayload(Reason.WRONG_ROUND, f"round {env.round_idx}, expected {round_idx}", env.client_id)


def verify_signature(
    env: Envelope, *, directory: IdentityDirectory, context: bytes, digest: bytes | None = None
) -> None:
    """``digest`` may be given if SHA-256(body) was computed elsewhere (e.g. in a thread)."""
    if digest is not None:
        env.__dict__["digest"] = digest  # fills the cached_property
    directory.verify(context, env.kind, env.round_idx, env.client_id, env.digest, env.signature)
