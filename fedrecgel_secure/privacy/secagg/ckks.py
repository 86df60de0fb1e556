"""Secure aggregation with CKKS homomorphic encryption (Cheon et al., ASIACRYPT 2017).

Roles and what each one holds:

* :class:`KeyHolder` creates the CKKS key pair and keeps the secret key; it
  publishes a *public* context (public key only: no secret, Galois or
  relinearisation keys, since the protocol only adds). It decrypts an aggregate
  only if the aggregate carries proofs of at least ``min_clients`` distinct,
  authenticated contributions of that round, and at most one aggregate per round,
  so it cannot be used to decrypt a single upload, nor two overlapping subsets
  whose difference would be one upload.
* :class:`CKKSClient` encrypts its clipped vector with the public context, packed
  into full ciphertexts of N/2 slots (the last one zero-padded), and signs the
  result (see :mod:`.identity`).
* :class:`CKKSAggregator` holds only the public context and bytes. It checks each
  envelope, deserialises the ciphertexts and folds them into a running sum as
  they arrive (memory stays O(D) however many clients), optionally adds
  encrypted Gaussian noise, and forwards the sum with the contributions' proofs.

Body of a ``CKKS_UPLOAD`` envelope, and the aggregate sent to the key holder::

    upload:    b"CKV1" | dim u32 | n_chunks u32 | (len u32 | TenSEAL CKKSVector)*
    aggregate: b"CKA1" | round u64 | dim u32 | noise_std f64 | n u32 | proof*n
               | n_chunks u32 | (len u32 | CKKSVector)*
               where proof = client u32 | SHA-256(body) | signature (100 bytes)

Parameters and security. The defaults, N = 8192 with coefficient moduli of
(52, 57) bits and scale 2^38, stay far below the 218-bit limit of the
HomomorphicEncryption.org standard for 128-bit security at N = 8192 (SEAL
enforces its own table as well). SEAL keeps the last prime for key switching,
which an addition-only protocol never does, so a ciphertext lives modulo the
first, 52-bit prime alone; SEAL's zstd compression then brings an upload to
about 29.8 bytes per value (32 with a 60-bit first prime, 81 with the common
(60, 40, 40, 60) chain).

Range. Decoding is correct while every aggregate coordinate satisfies
|z| < q0 / (2 Δ); :attr:`CKKSParams.value_bound` = 2^(bits(q0) - 2) / Δ is a safe
margin below it (4096 for the defaults). Clients clip to ``clip_range``, by
default value_bound / (2 · max_clients), leaving half the range for DP noise.

Precision. Each fresh encryption adds an error e with, with high probability,
‖e‖∞ ≤ B_clean / Δ, B_clean = 16·σ·N·√(2/3)·2 + 6·σ·√N (Cheon et al. 2017,
Lemma 1, with SEAL's uniform ternary secret and ephemeral key, σ = 3.2), plus at
most N / (2Δ) of encoding round-off. Errors of the n ciphertexts that are summed
(clients, plus one if noise is added) add, so

    |decrypt(aggregate)_j − Σ_i x_ij| ≤ n · (B_clean + N/2) / Δ     (w.h.p.; ≈ 84·N·n / Δ)

(:meth:`CKKSParams.error_bound`; 3.1e-4 for 122 clients at the defaults). The
errors are independent across clients, so in practice they grow like √n: over
many keys the largest error measured here stayed below 1.7 · N · √n / Δ, and
:meth:`CKKSParams.typical_error` states 4 · N · √n / Δ (1.3e-6 for 122 clients at
the defaults; at D = 372,000 with 122 clients the measured maximum was 4.7e-7).
The tests assert both. The error of a slot also depends on the public key's own
noise in that slot, which is why it is not identically distributed across slots.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tenseal as ts

from fedrecgel_secure.errors import BadInputError

from .errors import Reason, RejectedPayload, RoundSkipped
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
from .keys import read_private_file, write_private_file, write_public_file
from .vectors import check_dim, check_upload, clip

log = logging.getLogger("fedrecgel_secure.secagg")

# Largest total coefficient modulus for 128-bit classical security with a ternary
# secret (HomomorphicEncryption.org standard, Albrecht et al. 2018, Table 1).
MAX_MODULUS_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
SEAL_NOISE_STD = 3.2

_UPLOAD_HEAD = struct.Struct(">4sII")
_AGG_HEAD = struct.Struct(">4sQIdI")
_U32 = struct.Struct(">I")


@dataclass(frozen=True)
class CKKSParams:
    """CKKS parameters for an addition-only protocol at 128-bit security."""

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (52, 57)
    global_scale: float = 2.0**38
    clip_range: float | None = None

    def __post_init__(self) -> None:
        n = self.poly_modulus_degree
        if n not in MAX_MODULUS_BITS_128:
            raise BadInputError(f"ckks.poly_modulus_degree must be one of {sorted(MAX_MODULUS_BITS_128)}, got {n!r}")
        bits = tuple(self.coeff_mod_bit_sizes)
        object.__setattr__(self, "coeff_mod_bit_sizes", bits)
        if not bits or any(isinstance(b, bool) or not isinstance(b, int) or not 20 <= b <= 60 for b in bits):
            raise BadInputError(f"ckks.coeff_mod_bit_sizes must be integers in [20, 60], got {bits!r}")
        if sum(bits) > MAX_MODULUS_BITS_128[n]:
            raise BadInputError(
                f"ckks.coeff_mod_bit_sizes sum to {sum(bits)} bits; 128-bit security at "
                f"poly_modulus_degree {n} allows at most {MAX_MODULUS_BITS_128[n]}"
            )
        scale = self.global_scale
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 1):
            raise BadInputError(f"ckks.global_scale must be a finite number > 1, got {scale!r}")
        if self.value_bound < 1:
            raise BadInputError(
                f"ckks.global_scale 2^{math.log2(scale):.1f} leaves no room below the "
                f"{self.data_modulus_bits}-bit ciphertext modulus; use a smaller scale or larger first prime"
            )
        if self.clip_range is not None and not (0 < self.clip_range <= self.value_bound):
            raise BadInputError(f"ckks.clip_range must be in (0, {self.value_bound}], got {self.clip_range!r}")

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def data_modulus_bits(self) -> int:
        bits = self.coeff_mod_bit_sizes
        return sum(bits[:-1]) if len(bits) > 1 else bits[0]

    @property
    def value_bound(self) -> float:
        """Largest |aggregate coordinate| that decodes correctly, with a 2x margin."""
        return 2.0 ** (self.data_modulus_bits - 2) / self.global_scale

    def client_clip(self, max_clients: int) -> float:
        """Per-value clipping bound so that max_clients uploads use half the range."""
        if self.clip_range is not None:
            if self.clip_range * max_clients > self.value_bound:
                raise BadInputError(
                    f"ckks.clip_range {self.clip_range} times {max_clients} clients exceeds the "
                    f"decodable range {self.value_bound}"
                )
            return self.clip_range
        return self.value_bound / (2 * max_clients)

    def error_bound(self, n_ciphertexts: int) -> float:
        """High-probability bound on |error| of every coordinate of a sum of n encryptions."""
        n = self.poly_modulus_degree
        b_clean = 2 * 16 * SEAL_NOISE_STD * n * math.sqrt(2 / 3) + 6 * SEAL_NOISE_STD * math.sqrt(n)
        return n_ciphertexts * (b_clean + n / 2) / self.global_scale

    def typical_error(self, n_ciphertexts: int) -> float:
        """Bound that the measured maximum error stays under (errors add like a random walk)."""
        return 4 * self.poly_modulus_degree * math.sqrt(n_ciphertexts) / self.global_scale

    @property
    def data_primes(self) -> int:
        return max(1, len(self.coeff_mod_bit_sizes) - 1)


@dataclass(frozen=True)
class ContextInfo:
    """What a role reads back from a context it was handed as bytes."""

    poly_modulus_degree: int
    data_modulus_bits: int
    data_primes: int
    global_scale: float

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def value_bound(self) -> float:
        return 2.0 ** (self.data_modulus_bits - 2) / self.global_scale


def _params_of(ctx: ts.Context) -> ContextInfo:
    data = ctx.seal_context().data
    first = data.first_context_data()
    try:
        scale = float(ctx.global_scale)
    except ValueError:
        raise BadInputError("the CKKS context has no global scale") from None
    return ContextInfo(
        poly_modulus_degree=data.key_context_data().parms().poly_modulus_degree(),
        data_modulus_bits=first.total_coeff_modulus_bit_count(),
        data_primes=first.chain_index() + 1,
        global_scale=scale,
    )


def _load_context(data: bytes, what: str) -> ts.Context:
    try:
        ctx = ts.context_from(bytes(data), n_threads=1)
    except Exception as exc:  # TenSEAL raises several unrelated types on bad input
        raise BadInputError(f"{what} is not a TenSEAL context: {exc}") from None
    if str(ctx.seal_context().data.key_context_data().parms().scheme()) != "SCHEME_TYPE.CKKS":
        raise BadInputError(f"{what} is not a CKKS context")
    return ctx


def _read_chunks(body: bytes | memoryview, offset: int, count: int, max_chunk: int, client_id: int | None) -> list[bytes]:
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


def _load_vectors(ctx: ts.Context, params: ContextInfo, chunks: list[bytes], client_id: int | None) -> list:
    vectors = []
    for blob in chunks:
        try:
            vec = ts.ckks_vector_from(ctx, blob)
            size = vec.size()
            cts = vec.ciphertext()
            layout = [(ct.size(), ct.coeff_modulus_size(), ct.scale) for ct in cts]
        except Exception as exc:  # malformed protobuf or SEAL data: several exception types
            raise RejectedPayload(Reason.BAD_CIPHERTEXT, f"ciphertext does not load: {exc}", client_id) from None
        if size != params.slots:
            raise RejectedPayload(Reason.WRONG_SHAPE, f"ciphertext of {size} slots, expected {params.slots}", client_id)
        # A fresh encryption: one SEAL ciphertext of two components at the top data level.
        if layout != [(2, params.data_primes, layout[0][2] if layout else None)]:
            raise RejectedPayload(Reason.WRONG_PARAMS, f"unexpected ciphertext layout {layout}", client_id)
        if not math.isclose(layout[0][2], params.global_scale, rel_tol=1e-9):
            raise RejectedPayload(
                Reason.WRONG_PARAMS, f"ciphertext scale {layout[0][2]}, expected {params.global_scale}", client_id
            )
        vectors.append(vec)
    return vectors


def _max_chunk_bytes(params: ContextInfo) -> int:
    # An uncompressed two-component ciphertext at the data level, plus framing.
    return 2 * params.poly_modulus_degree * params.data_primes * 8 + 4096


def _n_chunks(dim: int, params: ContextInfo) -> int:
    return -(-dim // params.slots)


def decode_upload(body: bytes | memoryview, ctx: ts.Context, params: ContextInfo, dim: int, client_id: int | None = None) -> list:
    """Parse an upload body into CKKS vectors; raises only :class:`RejectedPayload`."""
    if len(body) < _UPLOAD_HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, "upload body shorter than its header", client_id)
    magic, body_dim, count = _UPLOAD_HEAD.unpack_from(body)
    if magic != b"CKV1":
        raise RejectedPayload(Reason.GARBAGE, "not a CKKS upload body", client_id)
    expected = _n_chunks(dim, params)
    if body_dim != dim or count != expected:
        raise RejectedPayload(
            Reason.WRONG_SHAPE, f"dim {body_dim} in {count} ciphertexts, expected {dim} in {expected}", client_id
        )
    chunks = _read_chunks(body, _UPLOAD_HEAD.size, count, _max_chunk_bytes(params), client_id)
    return _load_vectors(ctx, params, chunks, client_id)


class KeyHolder:
    """Holds the CKKS secret key and decrypts authenticated aggregates only."""

    def __init__(
        self, context: ts.Context, directory: IdentityDirectory, *, min_clients: int, session_tag: bytes
    ) -> None:
        if not context.is_private():
            raise BadInputError("a key holder needs a context with the secret key")
        if min_clients < 1:
            raise BadInputError(f"min_clients must be >= 1, got {min_clients}")
        self._ctx = context
        self.params = _params_of(context)
        self.directory = directory
        self.min_clients = min_clients
        self.session_tag = check_session_tag(session_tag)
        self.last_decrypted_round = -1

    @classmethod
    def create(
        cls, params: CKKSParams, directory: IdentityDirectory, *, min_clients: int, session_tag: bytes
    ) -> KeyHolder:
        ctx = ts.context(
            ts.SCHEME_TYPE.CKKS,
            poly_modulus_degree=params.poly_modulus_degree,
            coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
            n_threads=1,
        )
        ctx.global_scale = params.global_scale
        return cls(ctx, directory, min_clients=min_clients, session_tag=session_tag)

    @classmethod
    def load(
        cls, path: str | Path, directory: IdentityDirectory, *, min_clients: int, session_tag: bytes
    ) -> KeyHolder:
        ctx = _load_context(read_private_file(path), f"key file {path}")
        if not ctx.is_private():
            raise BadInputError(f"{path} holds a public context; the key holder needs the secret key")
        return cls(ctx, directory, min_clients=min_clients, session_tag=session_tag)

    def save(self, path: str | Path) -> None:
        """Write the secret context to a 0600 file."""
        secret = self._ctx.serialize(save_public_key=True, save_secret_key=True, save_galois_keys=False, save_relin_keys=False)
        write_private_file(path, secret)

    def public_context(self) -> bytes:
        """Context for clients and the aggregator: encrypts, cannot decrypt."""
        return self._ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)

    def write_public_context(self, path: str | Path) -> None:
        write_public_file(path, self.public_context())

    def decrypt(self, aggregate: bytes) -> np.ndarray:
        """Decrypt an aggregate built from at least ``min_clients`` authenticated uploads."""
        try:
            return self._decrypt(bytes(aggregate))
        except RejectedPayload as exc:
            log.warning("key holder refused an aggregate: %s", exc)
            raise

    def _decrypt(self, data: bytes) -> np.ndarray:
        if len(data) < _AGG_HEAD.size:
            raise RejectedPayload(Reason.TRUNCATED, "aggregate shorter than its header")
        magic, round_idx, dim, _noise, n = _AGG_HEAD.unpack_from(data)
        if magic != b"CKA1":
            raise RejectedPayload(Reason.GARBAGE, "not a CKKS aggregate")
        if round_idx <= self.last_decrypted_round:
            raise RejectedPayload(Reason.REPLAY, f"an aggregate of round {round_idx} or later was already decrypted")
        if n < self.min_clients:
            raise RejectedPayload(Reason.TOO_FEW_CONTRIBUTORS, f"{n} contributions, at least {self.min_clients} required")
        offset = _AGG_HEAD.size
        end = offset + n * ContributionProof.SIZE
        if len(data) < end + 4:
            raise RejectedPayload(Reason.TRUNCATED, "aggregate ends inside the contribution proofs")
        seen: set[int] = set()
        for k in range(n):
            start = offset + k * ContributionProof.SIZE
            proof = ContributionProof.parse(data[start : start + ContributionProof.SIZE])
            if proof.client_id in seen:
                raise RejectedPayload(Reason.DUPLICATE_CLIENT, "client listed twice in the aggregate", proof.client_id)
            self.directory.verify(
                self.session_tag, Kind.CKKS_UPLOAD, round_idx, proof.client_id, proof.digest, proof.signature
            )
            seen.add(proof.client_id)
        (count,) = _U32.unpack_from(data, end)
        if dim == 0 or count != _n_chunks(dim, self.params):
            raise RejectedPayload(Reason.WRONG_SHAPE, f"{count} ciphertexts cannot hold dim {dim}")
        chunks = _read_chunks(data, end + 4, count, _max_chunk_bytes(self.params), None)
        vectors = _load_vectors(self._ctx, self.params, chunks, None)
        total = np.concatenate([np.asarray(v.decrypt(), dtype=np.float64) for v in vectors])[:dim]
        self.last_decrypted_round = round_idx
        return total


class CKKSClient:
    """Encrypts and signs one client's upload with the public context."""

    def __init__(
        self, identity: ClientIdentity, public_context: bytes | ts.Context, dim: int, *, clip_range: float, session_tag: bytes
    ) -> None:
        # A loaded context is accepted so that simulated clients can share one
        # (loading costs ~25 ms each); it must still be public.
        ctx = public_context if isinstance(public_context, ts.Context) else _load_context(public_context, "client context")
        if ctx.is_private():
            raise BadInputError("a client must get the public context, not one with the secret key")
        self._ctx = ctx
        self.params = _params_of(ctx)
        self.identity = identity
        self.dim = check_dim(dim)
        if not (0 < clip_range <= self.params.value_bound):
            raise BadInputError(f"clip_range must be in (0, {self.params.value_bound}], got {clip_range!r}")
        self.clip_range = float(clip_range)
        self.session_tag = check_session_tag(session_tag)
        self.last_clipped = 0

    def upload(self, round_idx: int, x: np.ndarray) -> bytes:
        check_round(round_idx)
        values, self.last_clipped = clip(check_upload(x, self.dim, self.identity.client_id), self.clip_range)
        body = encrypt_vector(self._ctx, self.params, values)
        return self.identity.seal(Kind.CKKS_UPLOAD, round_idx, body, self.session_tag)


def _encrypt_chunks(ctx: ts.Context, params: ContextInfo, values: np.ndarray) -> list[bytes]:
    s = params.slots
    padded = np.zeros(_n_chunks(values.shape[0], params) * s)
    padded[: values.shape[0]] = values
    return [ts.ckks_vector(ctx, padded[i : i + s]).serialize() for i in range(0, padded.shape[0], s)]


def _frame(chunks: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(c)) + c for c in chunks)


def encrypt_vector(ctx: ts.Context, params: ContextInfo, values: np.ndarray) -> bytes:
    chunks = _encrypt_chunks(ctx, params, values)
    return _UPLOAD_HEAD.pack(b"CKV1", values.shape[0], len(chunks)) + _frame(chunks)


class EncryptedAggregate:
    """Sum of a round's ciphertexts, with the proofs of who contributed."""

    def __init__(
        self, ctx: ts.Context, params: ContextInfo, round_idx: int, dim: int, proofs: list[ContributionProof], vectors: list
    ) -> None:
        self._ctx = ctx
        self.params = params
        self.round_idx = round_idx
        self.dim = dim
        self.proofs = proofs
        self._vectors = vectors
        self.noise_std = 0.0

    @property
    def contributors(self) -> list[int]:
        return sorted(p.client_id for p in self.proofs)

    def add_noise(self, noise: np.ndarray) -> None:
        """Add the (dim,) ``noise`` vector to the sum under encryption; its plaintext is the caller's to discard.

        The key holder then only ever decrypts the noisy sum. The party running
        this step drew the noise, so it must not also be the one that receives
        the decrypted result if the noiseless sum is to stay hidden from everyone.
        """
        noise = np.asarray(noise, dtype=np.float64)
        if noise.shape != (self.dim,) or not np.isfinite(noise).all():
            raise BadInputError(f"noise must be a finite vector of length {self.dim}")
        if 2 * np.abs(noise).max(initial=0.0) > self.params.value_bound:
            raise BadInputError(f"noise does not fit the decodable range {self.params.value_bound}")
        s = self.params.slots
        for k, vec in enumerate(self._vectors):
            chunk = np.zeros(s)
            width = min(s, self.dim - k * s)
            chunk[:width] = noise[k * s : k * s + width]
            vec.add_(ts.ckks_vector(self._ctx, chunk))
        self.noise_std = float(np.std(noise))

    def serialize(self) -> bytes:
        head = _AGG_HEAD.pack(b"CKA1", self.round_idx, self.dim, self.noise_std, len(self.proofs))
        chunks = [v.serialize() for v in self._vectors]
        return head + b"".join(p.to_bytes() for p in self.proofs) + _U32.pack(len(chunks)) + _frame(chunks)


class CKKSAggregator:
    """Adds encrypted uploads; holds only the public context and never a plaintext upload."""

    def __init__(
        self, public_context: bytes, directory: IdentityDirectory, dim: int, *, min_clients: int, session_tag: bytes
    ) -> None:
        ctx = _load_context(public_context, "aggregator context")
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
    ) -> CKKSAggregator:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise BadInputError(f"{path}: cannot read public context ({exc.strerror})") from None
        ctx = _load_context(data, f"public context file {path}")
        if ctx.is_private():
            raise BadInputError(f"{path} contains a secret key; the aggregator must be given the public context only")
        return cls(data, directory, dim, min_clients=min_clients, session_tag=session_tag)

    @property
    def context(self) -> ts.Context:
        return self._ctx

    def _hasher(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="secagg-hash")
        return self._pool

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
                env, directory=self.directory, kind=Kind.CKKS_UPLOAD, round_idx=self._round,
                completed_round=self.last_completed_round,
            )
            # Hashing releases the GIL while TenSEAL's loader does not, so the body
            # is hashed in a thread while the ciphertexts load; nothing is added
            # to the sum before the signature has been checked.
            hashing = self._hasher().submit(hashlib.sha256, env.body)
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
            log.warning("round %s: rejected CKKS upload from %s: %s", self._round, exc.client_id, exc)
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
        aggregate = EncryptedAggregate(
            self._ctx, self.params, self._round, self.dim, [self._proofs[c] for c in sorted(self._proofs)], self._sum
        )
        self.last_completed_round = self._round
        self._round, self._proofs, self._sum = None, {}, None
        return aggregate
