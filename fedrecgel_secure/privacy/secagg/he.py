"""Secure aggregation with exact homomorphic encryption: TenSEAL BFV on the fixed-point grid.

Threat model, plainly. HE protects the clients' uploads from an
**honest-but-curious aggregator that does not collude with the key holder**:
the aggregator sees ciphertexts and the released sum, nothing else. A
*malicious* aggregator (one that forges or reorders what it forwards), or one
that colludes with the key holder, is out of scope: the key holder checks what
it can (below) but cannot see the ciphertexts the aggregate was summed from.
Deployments that must resist a malicious server should use ``"masking"``
(:mod:`.masking`), which needs no key holder.

Roles:

* :class:`~.he_keyholder.KeyHolder` creates the BFV key pair and keeps the
  secret key; it publishes a *public* context (public key only). It releases
  at most one aggregate per round, of the dimension registered when it was
  created, carrying at least ``min_clients`` distinct, valid contribution
  proofs of that round, and it adds the central DP noise itself.
* :class:`HEClient` puts its vector on the shared fixed-point grid
  (:class:`.fixedpoint.FixedPoint`, the same integers masking sums), encrypts
  them as BFV plaintexts mod the prime t, and signs SHA-256 of the ciphertext
  bytes (the envelope of :mod:`.identity`).
* :class:`HEAggregator` holds only the public context; it checks each envelope,
  adds the ciphertexts as they arrive and forwards the sum with the proofs
  (client id, digest of that client's ciphertext bytes, signature).

Why BFV and not CKKS. CKKS decryption is approximate: the decrypted value is
c0 + c1·s *including* the encryption error, so whoever receives it can solve a
linear system for the secret key s (Li and Micciancio, Eurocrypt 2021). BFV
decryption rounds the error away and the key holder releases only the exact
integer sum decoded on the grid, so the release equals Σ m_i and carries no
information about the error: the linear system has the unknown, large error
term on its right-hand side (see tests/attacks/test_he_key_recovery.py).
Because the grid is the masking grid, HE and masking release bit-identical
aggregates.

Wire formats (body of a ``Kind.CKKS_UPLOAD`` envelope; the kind is the HE
upload kind, its name is kept for wire compatibility)::

    upload:    b"BFV1" | dim u32 | n_chunks u32 | (len u32 | TenSEAL BFVVector)*
    aggregate: b"BFA1" | round u64 | dim u32 | n u32 | proof*n
               | n_chunks u32 | (len u32 | BFVVector)*
               where proof = client u32 | SHA-256(upload body) | signature (100 bytes)

Parameters. N = 8192, coefficient moduli (60, 60, 60) bits (180 of the 218 the
HomomorphicEncryption.org standard allows for 128-bit security at N = 8192;
the last prime is SEAL's key-switching prime, so ciphertexts live mod 120
bits), plain modulus t the largest 59-bit prime ≡ 1 mod 2N (SEAL's batching
needs t ≡ 1 mod 2N; it rejects 60 bits). One ciphertext packs N = 8192 grid
integers; an upload is about 32 bytes per value.

Range. The sum is exact while every coordinate satisfies |Σ g_i| < t/2;
:meth:`BFVParams.check_capacity` refuses at construction any setting where
``max_clients`` clipped values plus 10σ of central noise could reach it, and
where the BFV noise of that many summed ciphertexts could reach q/(2t).
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import tenseal as ts
import tenseal.sealapi  # noqa: F401  registers SEAL's Modulus type, read by _params_of

from fedrecgel_secure.errors import BadInputError

from .errors import Reason, RejectedPayload, RoundSkipped
from .fixedpoint import FixedPoint
from .identity import (
    ClientIdentity,
    ContributionProof,
    Envelope,
    IdentityDirectory,
    Kind,
    check_header,
    check_round,
    check_session_tag,
    verify_signature,
)
from .vectors import check_dim, check_upload

log = logging.getLogger("fedrecgel_secure.secagg")

# Largest total coefficient modulus for 128-bit classical security with a ternary
# secret (HomomorphicEncryption.org standard, Albrecht et al. 2018, Table 1).
MAX_MODULUS_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
SEAL_NOISE_STD = 3.2
HE_UPLOAD = Kind.CKKS_UPLOAD  # the identity module's name for the HE upload kind

_UPLOAD_HEAD = struct.Struct(">4sII")
_AGG_HEAD = struct.Struct(">4sQII")
_U32 = struct.Struct(">I")


def is_prime(n: int) -> bool:
    """Deterministic Miller–Rabin for n < 3.3e24 (first 13 prime bases)."""
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n < 2:
        return False
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def batching_prime(bits: int, poly_modulus_degree: int) -> int:
    """The largest prime below 2^bits that is ≡ 1 mod 2N, so that SEAL can batch N values per plaintext."""
    step = 2 * poly_modulus_degree
    k = (2**bits - 2) // step
    while k > 0:
        p = k * step + 1
        if p.bit_length() == bits and is_prime(p):
            return p
        k -= 1
    raise BadInputError(f"no {bits}-bit prime ≡ 1 mod {step}")


@dataclass(frozen=True)
class BFVParams:
    """BFV parameters for an addition-only protocol at 128-bit security."""

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 60, 60)
    plain_modulus_bits: int = 59

    def __post_init__(self) -> None:
        n = self.poly_modulus_degree
        if isinstance(n, bool) or n not in MAX_MODULUS_BITS_128:
            raise BadInputError(f"bfv.poly_modulus_degree must be one of {sorted(MAX_MODULUS_BITS_128)}, got {n!r}")
        bits = tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        if len(bits) < 2 or any(isinstance(b, bool) or not isinstance(b, int) or not 20 <= b <= 60 for b in bits):
            raise BadInputError(f"bfv.coeff_mod_bit_sizes must be at least two integers in [20, 60], got {bits!r}")
        if sum(bits) > MAX_MODULUS_BITS_128[n]:
            raise BadInputError(
                f"bfv.coeff_mod_bit_sizes sum to {sum(bits)} bits; 128-bit security at "
                f"poly_modulus_degree {n} allows at most {MAX_MODULUS_BITS_128[n]}"
            )
        t = self.plain_modulus_bits
        if isinstance(t, bool) or not isinstance(t, int) or not 20 <= t <= 59:
            raise BadInputError(f"bfv.plain_modulus_bits must be an integer in [20, 59] (SEAL rejects 60), got {t!r}")
        if t >= sum(bits[:-1]) - 20:
            raise BadInputError(f"bfv.plain_modulus_bits {t} leaves no room for noise below the {sum(bits[:-1])}-bit modulus")

    @cached_property
    def plain_modulus(self) -> int:
        return batching_prime(self.plain_modulus_bits, self.poly_modulus_degree)

    def context(self) -> ts.Context:
        """A fresh secret context (for the key holder)."""
        return ts.context(
            ts.SCHEME_TYPE.BFV, poly_modulus_degree=self.poly_modulus_degree, plain_modulus=self.plain_modulus,
            coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes), n_threads=1,
        )


@dataclass(frozen=True)
class ContextInfo:
    """What a role reads back from a BFV context it was handed as bytes."""

    poly_modulus_degree: int
    plain_modulus: int
    data_modulus: int  # q: the product of the primes a ciphertext lives under
    data_primes: int

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree

    def fresh_noise_bound(self) -> int:
        """Worst-case |noise| of one public-key encryption: e1 + e·u + e2·s with ternary u, s, |e| ≤ 6σ."""
        return math.ceil(6 * SEAL_NOISE_STD * (2 * self.poly_modulus_degree + 1))

    def max_summands(self) -> int:
        """How many fresh ciphertexts can be added before the noise could break decryption.

        A sum of n encryptions decrypts to Σ m_i mod t while its noise stays below q/(2t);
        each summand brings at most its fresh noise plus (q mod t) from the wrap-around of
        the plaintext sum.
        """
        q, t = self.data_modulus, self.plain_modulus
        return (q // (2 * t)) // (self.fresh_noise_bound() + q % t)

    def check_capacity(self, encoding: FixedPoint, max_summands: int, field: str, noise_std: float = 0.0) -> None:
        """Refuse settings under which a sum of ``max_summands`` uploads (+ noise) might not decrypt exactly."""
        if max_summands > self.max_summands():
            raise BadInputError(
                f"{field}: {max_summands} summed ciphertexts could exceed the BFV noise budget"
                f" ({self.max_summands()} at most); use more coefficient-modulus bits or fewer clients"
            )
        # |sum| < t/2 is what centre-lifting needs; check_capacity's bound is 2^(bits-1) ≤ t/2.
        encoding.check_capacity(max_summands, self.plain_modulus.bit_length() - 1, field, noise_std)


def _params_of(ctx: ts.Context) -> ContextInfo:
    data = ctx.seal_context().data
    first = data.first_context_data().parms()
    q = 1
    for prime in first.coeff_modulus():
        q *= prime.value()
    return ContextInfo(
        poly_modulus_degree=first.poly_modulus_degree(),
        plain_modulus=first.plain_modulus().value(),
        data_modulus=q,
        data_primes=len(first.coeff_modulus()),
    )


def load_context(data: bytes, what: str) -> ts.Context:
    try:
        ctx = ts.context_from(bytes(data), n_threads=1)
    except Exception as exc:  # TenSEAL raises several unrelated types on bad input
        raise BadInputError(f"{what} is not a TenSEAL context: {exc}") from None
    if str(ctx.seal_context().data.key_context_data().parms().scheme()) != "SCHEME_TYPE.BFV":
        raise BadInputError(f"{what} is not a BFV context (CKKS is refused: its approximate decryptions leak the key)")
    return ctx


def read_chunks(body: bytes | memoryview, offset: int, count: int, max_chunk: int, client_id: int | None) -> list[bytes]:
    chunks = []
    for _ in range(count):
        if offset + 4 > len(body):
            raise RejectedPayload(Reason.TRUNCATED, "ciphertext list ends early", client_id)
        (length,) = _U32.unpack_from(body, offset)
        offset += 4
        if length > max_chunk:
            raise RejectedPayload(Reason.WRONG_SHAPE, f"ciphertext of {length} bytes exceeds {max_chunk}", client_id)
        if offset + length > len(body):
            raise RejectedPayload(Reason.TRUNCATED, "ciphertext ends early", client_id)
        chunks.append(bytes(body[offset : offset + length]))  # TenSEAL takes bytes only
        offset += length
    if offset != len(body):
        raise RejectedPayload(Reason.GARBAGE, f"{len(body) - offset} trailing bytes", client_id)
    return chunks


def load_vectors(ctx: ts.Context, params: ContextInfo, chunks: list[bytes], client_id: int | None) -> list:
    vectors = []
    for blob in chunks:
        try:
            vec = ts.bfv_vector_from(ctx, blob)
            size = vec.size()
            layout = [(ct.size(), ct.coeff_modulus_size()) for ct in vec.ciphertext()]
        except Exception as exc:  # malformed protobuf or SEAL data: several exception types
            raise RejectedPayload(Reason.BAD_CIPHERTEXT, f"ciphertext does not load: {exc}", client_id) from None
        if size != params.slots:
            raise RejectedPayload(Reason.WRONG_SHAPE, f"ciphertext of {size} slots, expected {params.slots}", client_id)
        # One SEAL ciphertext of two components at the top data level, as encryption and addition leave it.
        if layout != [(2, params.data_primes)]:
            raise RejectedPayload(Reason.WRONG_PARAMS, f"unexpected ciphertext layout {layout}", client_id)
        vectors.append(vec)
    return vectors


def max_chunk_bytes(params: ContextInfo) -> int:
    # An uncompressed two-component ciphertext at the data level, plus framing.
    return 2 * params.poly_modulus_degree * params.data_primes * 8 + 4096


def n_chunks(dim: int, params: ContextInfo) -> int:
    return -(-dim // params.slots)


def frame(chunks: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(c)) + c for c in chunks)


def decode_upload(body: bytes | memoryview, ctx: ts.Context, params: ContextInfo, dim: int, client_id: int | None = None) -> list:
    """Parse an upload body into BFV vectors; raises only :class:`RejectedPayload`."""
    if len(body) < _UPLOAD_HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, "upload body shorter than its header", client_id)
    magic, body_dim, count = _UPLOAD_HEAD.unpack_from(body)
    if magic != b"BFV1":
        raise RejectedPayload(Reason.GARBAGE, "not a BFV upload body", client_id)
    expected = n_chunks(dim, params)
    if body_dim != dim or count != expected:
        raise RejectedPayload(
            Reason.WRONG_SHAPE, f"dim {body_dim} in {count} ciphertexts, expected {dim} in {expected}", client_id
        )
    chunks = read_chunks(body, _UPLOAD_HEAD.size, count, max_chunk_bytes(params), client_id)
    return load_vectors(ctx, params, chunks, client_id)


def encrypt_ints(ctx: ts.Context, params: ContextInfo, ints: np.ndarray) -> bytes:
    """Upload body of signed grid integers (|v| < t/2; SEAL maps a negative v to t + v)."""
    s = params.slots
    count = n_chunks(ints.shape[0], params)
    padded = np.zeros(count * s, dtype=np.int64)
    padded[: ints.shape[0]] = ints
    chunks = [ts.bfv_vector(ctx, padded[i : i + s].tolist()).serialize() for i in range(0, padded.shape[0], s)]
    return _UPLOAD_HEAD.pack(b"BFV1", ints.shape[0], count) + frame(chunks)


def centre_lift(values: np.ndarray, modulus: int) -> np.ndarray:
    """Residues mod t (any representative) as signed int64 in (-t/2, t/2]."""
    v = np.asarray(values, dtype=np.int64) % modulus
    return np.where(v > modulus // 2, v - modulus, v)


class HEClient:
    """Encodes one client's vector on the grid, encrypts it with the public context and signs it."""

    def __init__(
        self, identity: ClientIdentity, public_context: bytes | ts.Context, dim: int, *, encoding: FixedPoint,
        session_tag: bytes,
    ) -> None:
        # A loaded context is accepted so that simulated clients can share one; it must still be public.
        ctx = public_context if isinstance(public_context, ts.Context) else load_context(public_context, "client context")
        if ctx.is_private():
            raise BadInputError("a client must get the public context, not one with the secret key")
        self._ctx = ctx
        self.params = _params_of(ctx)
        self.identity = identity
        self.dim = check_dim(dim)
        self.encoding = encoding
        if 2 * encoding.limit >= self.params.plain_modulus:
            raise BadInputError("the fixed-point range does not fit the BFV plain modulus")
        self.session_tag = check_session_tag(session_tag)
        self.last_clipped = 0

    def upload(self, round_idx: int, x: np.ndarray, noise: np.ndarray | None = None) -> bytes:
        """Signed envelope of ``x`` (plus its DP ``noise`` share) on the grid, encrypted."""
        check_round(round_idx)
        x = check_upload(x, self.dim, self.identity.client_id)
        ints, self.last_clipped = self.encoding.encode(x, noise)
        body = encrypt_ints(self._ctx, self.params, ints)
        return self.identity.seal(HE_UPLOAD, round_idx, body, self.session_tag)


class EncryptedAggregate:
    """Sum of a round's ciphertexts, with the proofs of who contributed."""

    def __init__(self, round_idx: int, dim: int, proofs: list[ContributionProof], vectors: list) -> None:
        self.round_idx = round_idx
        self.dim = dim
        self.proofs = proofs
        self._vectors = vectors

    @property
    def contributors(self) -> list[int]:
        return sorted(p.client_id for p in self.proofs)

    def serialize(self) -> bytes:
        head = _AGG_HEAD.pack(b"BFA1", self.round_idx, self.dim, len(self.proofs))
        chunks = [v.serialize() for v in self._vectors]
        return head + b"".join(p.to_bytes() for p in self.proofs) + _U32.pack(len(chunks)) + frame(chunks)


def parse_aggregate(data: bytes) -> tuple[int, int, list[ContributionProof], int, int]:
    """(round, dim, proofs, offset of the chunk count, chunk count) of a serialized aggregate; layout checks only."""
    if len(data) < _AGG_HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, "aggregate shorter than its header")
    magic, round_idx, dim, n = _AGG_HEAD.unpack_from(data)
    if magic != b"BFA1":
        raise RejectedPayload(Reason.GARBAGE, "not a BFV aggregate")
    end = _AGG_HEAD.size + n * ContributionProof.SIZE
    if len(data) < end + 4:
        raise RejectedPayload(Reason.TRUNCATED, "aggregate ends inside the contribution proofs")
    proofs = [
        ContributionProof.parse(data[k : k + ContributionProof.SIZE])
        for k in range(_AGG_HEAD.size, end, ContributionProof.SIZE)
    ]
    (count,) = _U32.unpack_from(data, end)
    return round_idx, dim, proofs, end + 4, count


class HEAggregator:
    """Adds encrypted uploads; holds only the public context and never a plaintext upload."""

    def __init__(
        self, public_context: bytes, directory: IdentityDirectory, dim: int, *, min_clients: int, session_tag: bytes
    ) -> None:
        ctx = load_context(public_context, "aggregator context")
        if ctx.is_private():
            raise BadInputError("the aggregator was given a context that contains the secret key; give it the public context")
        if min_clients < 1:
            raise BadInputError(f"min_clients must be >= 1, got {min_clients}")
        self._ctx = ctx
        self.params = _params_of(ctx)
        self.directory = directory
        self.dim = check_dim(dim)
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_completed_round = -1
        self._round: int | None = None
        self._proofs: dict[int, ContributionProof] = {}
        self._sum: list | None = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_public_context_file(
        cls, path: str | Path, directory: IdentityDirectory, dim: int, *, min_clients: int, session_tag: bytes
    ) -> HEAggregator:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise BadInputError(f"{path}: cannot read public context ({exc.strerror})") from None
        return cls(data, directory, dim, min_clients=min_clients, session_tag=session_tag)

    @property
    def context(self) -> ts.Context:
        return self._ctx

    @property
    def contributors(self) -> list[int]:
        return sorted(self._proofs)

    def begin_round(self, round_idx: int) -> None:
        check_round(round_idx)
        if round_idx <= self.last_completed_round:
            raise BadInputError(f"round {round_idx} is not after the last completed round {self.last_completed_round}")
        self._round, self._proofs, self._sum = round_idx, {}, None

    def receive(self, payload: bytes) -> int:
        """Check one upload and add it to the running sum; returns the client id."""
        if self._round is None:
            raise BadInputError("begin_round() must be called before receiving uploads")
        try:
            env = Envelope.parse(payload, zero_copy=True)
            check_header(
                env, directory=self.directory, kind=HE_UPLOAD, round_idx=self._round,
                completed_round=self.last_completed_round,
            )
            # Hashing releases the GIL while TenSEAL's loader does not, so the body is hashed in a
            # thread while the ciphertexts load; nothing is added before the signature is checked.
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="secagg-hash")
            hashing = self._pool.submit(hashlib.sha256, env.body)
            try:
                vectors, problem = decode_upload(env.body, self._ctx, self.params, self.dim, env.client_id), None
            except RejectedPayload as exc:
                vectors, problem = None, exc
            verify_signature(env, directory=self.directory, context=self.session_tag, digest=hashing.result().digest())
            if env.client_id in self._proofs:
                raise RejectedPayload(Reason.DUPLICATE_CLIENT, "already contributed this round", env.client_id)
            if problem is not None:
                raise problem
        except RejectedPayload as exc:
            log.warning("round %s: rejected HE upload from %s: %s", self._round, exc.client_id, exc)
            raise
        if self._sum is None:
            self._sum = vectors
        else:
            for acc, vec in zip(self._sum, vectors):
                acc.add_(vec)
        self._proofs[env.client_id] = ContributionProof(env.client_id, env.digest, env.signature)
        return env.client_id

    def finish(self) -> EncryptedAggregate:
        """Close the round; raises :class:`RoundSkipped` (state unchanged) below ``min_clients``."""
        if self._round is None:
            raise BadInputError("no round in progress")
        if len(self._proofs) < self.min_clients or self._sum is None:
            detail = f"round {self._round}: {len(self._proofs)} valid uploads, {self.min_clients} required"
            self._round, self._proofs, self._sum = None, {}, None
            raise RoundSkipped("too_few_clients", detail)
        aggregate = EncryptedAggregate(self._round, self.dim, [self._proofs[c] for c in sorted(self._proofs)], self._sum)
        self.last_completed_round = self._round
        self._round, self._proofs, self._sum = None, {}, None
        return aggregate
