"""BFV wire formats and context checks shared by the HE roles (the protocol: this package's docstring).

    upload:    b"BFV1" | dim u32 | n_chunks u32 | (len u32 | TenSEAL BFVVector)*
    aggregate: b"BFA1" | round u64 | dim u32 | n u32 | proof*n
               | n_chunks u32 | (len u32 | BFVVector)*
    bound:     b"BFA2" | round u64 | dim u32 | n u32 | participants u32 | digest 32 | proof*n | (as BFA1)

A bound aggregate's proofs are signed under its :class:`Binding` (a deployment's users: what their contribution
was computed from); an unbound one's under the session tag alone (the simulator's clients).

Every parser raises only :class:`RejectedPayload` on bad bytes.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

import numpy as np
import tenseal as ts
import tenseal.sealapi

from fedrecgel_secure.errors import BadInputError

from ..errors import Reason, RejectedPayload
from ..fixedpoint import FixedPoint
from ..identity import ContributionProof

SEAL_NOISE_STD = 3.2
_UPLOAD_HEAD = struct.Struct(">4sII")
_AGG_HEAD = struct.Struct(">4sQII")
_U32 = struct.Struct(">I")
_BINDING = struct.Struct(">I32s")


@dataclass(frozen=True)
class Binding:
    """What a deployment's users computed their contribution from, which every proof of theirs is signed over.

    ``digest``: SHA-256 of the model and DP settings their node was sent
    (:func:`~fedrecgel_secure.deploy.messages.train_binding`), so users sent different models cannot be
    summed together (model inconsistency); ``participants``: the sample their DP noise shares were sized for (0:
    no shares), so the key holder can refuse an aggregate of fewer users than the shares assume.
    """

    participants: int
    digest: bytes

    def to_bytes(self) -> bytes:
        return _BINDING.pack(self.participants, self.digest)

    def context(self, session_tag: bytes) -> bytes:
        """The signature context of a proof under this binding: the session tag, then the binding's hash."""
        return session_tag + hashlib.sha256(b"fedrecgel/bfv-binding/v1" + self.to_bytes()).digest()


def signing_context(session_tag: bytes, binding: Binding | None) -> bytes:
    """What a contribution proof is signed under: the binding's context, or the session tag when unbound."""
    return session_tag if binding is None else binding.context(session_tag)


def aggregate_head(round_idx: int, dim: int, n: int, binding: Binding | None) -> bytes:
    """An aggregate's header up to its proofs: BFA1, or BFA2 with the binding."""
    if binding is None:
        return _AGG_HEAD.pack(b"BFA1", round_idx, dim, n)
    return _AGG_HEAD.pack(b"BFA2", round_idx, dim, n) + binding.to_bytes()


def aggregate_binding(data: bytes) -> Binding | None:
    """The binding of a serialized aggregate (None for BFA1); call after :func:`parse_aggregate` accepted it."""
    if data[:4] != b"BFA2":
        return None
    participants, digest = _BINDING.unpack_from(data, _AGG_HEAD.size)
    return Binding(participants, digest)


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

    @property
    def data_slots(self) -> int:
        """Values per ciphertext: every slot but the last, which holds the tag (:mod:`.tags`)."""
        return self.poly_modulus_degree - 1

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


def read_chunks(
    body: bytes | memoryview, offset: int, count: int, max_chunk: int, client_id: int | None
) -> list[bytes]:
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
            layout = [(ct.size(), ct.coeff_modulus_size(), ct.is_ntt_form()) for ct in vec.ciphertext()]
        except Exception as exc:  # malformed protobuf or SEAL data: several exception types
            raise RejectedPayload(Reason.BAD_CIPHERTEXT, f"ciphertext does not load: {exc}", client_id) from None
        if size != params.slots:
            raise RejectedPayload(Reason.WRONG_SHAPE, f"ciphertext of {size} slots, expected {params.slots}", client_id)
        # One SEAL ciphertext of two components at the top data level, not in NTT form, as encryption and
        # addition leave it (SEAL's decryption raises on an NTT-form ciphertext: a fuzzed aggregate found it).
        if layout != [(2, params.data_primes, False)]:
            raise RejectedPayload(Reason.WRONG_PARAMS, f"unexpected ciphertext layout {layout}", client_id)
        vectors.append(vec)
    return vectors


def max_chunk_bytes(params: ContextInfo) -> int:
    # An uncompressed two-component ciphertext at the data level, plus framing.
    return 2 * params.poly_modulus_degree * params.data_primes * 8 + 4096


def n_chunks(dim: int, params: ContextInfo) -> int:
    return -(-dim // params.data_slots)


def frame(chunks: list[bytes]) -> bytes:
    return b"".join(_U32.pack(len(c)) + c for c in chunks)


def decode_upload(
    body: bytes | memoryview, ctx: ts.Context, params: ContextInfo, dim: int, client_id: int | None = None
) -> list:
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


def encrypt_ints(ctx: ts.Context, params: ContextInfo, dim: int, chunks: np.ndarray, tags: list[int]) -> bytes:
    """Upload body of ``dim`` values: each row of ``chunks`` (signed grid integers, |v| < t/2, zero-padded) then its
    tag, one ciphertext per row."""
    t = params.plain_modulus
    blobs = []
    for row, tag in zip(chunks, tags):
        tag = tag - t if tag > t // 2 else tag  # SEAL maps a negative v to t + v
        blobs.append(ts.bfv_vector(ctx, [*row.tolist(), tag]).serialize())
    return _UPLOAD_HEAD.pack(b"BFV1", dim, len(blobs)) + frame(blobs)


def centre_lift(values: np.ndarray, modulus: int) -> np.ndarray:
    """Residues mod t (any representative) as signed int64 in (-t/2, t/2]."""
    v = np.asarray(values, dtype=np.int64) % modulus
    return np.where(v > modulus // 2, v - modulus, v)


def parse_aggregate(data: bytes) -> tuple[int, int, list[ContributionProof], int, int]:
    """(round, dim, proofs, offset of the chunk count, chunk count) of a serialized aggregate; layout checks only."""
    if len(data) < _AGG_HEAD.size:
        raise RejectedPayload(Reason.TRUNCATED, "aggregate shorter than its header")
    magic, round_idx, dim, n = _AGG_HEAD.unpack_from(data)
    if magic not in (b"BFA1", b"BFA2"):
        raise RejectedPayload(Reason.GARBAGE, "not a BFV aggregate")
    start = _AGG_HEAD.size + (_BINDING.size if magic == b"BFA2" else 0)
    end = start + n * ContributionProof.SIZE
    if len(data) < end + 4:
        raise RejectedPayload(Reason.TRUNCATED, "aggregate ends inside the contribution proofs")
    proofs = [
        ContributionProof.parse(data[k : k + ContributionProof.SIZE]) for k in range(start, end, ContributionProof.SIZE)
    ]
    (count,) = _U32.unpack_from(data, end)
    return round_idx, dim, proofs, end + 4, count
