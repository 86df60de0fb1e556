"""Attack: recover the HE secret key from a released decryption (Li and Micciancio, Eurocrypt 2021; issue #10,
finding 1).

The adversary is the honest-but-curious aggregator. It holds the aggregate
ciphertext (c0, c1) it sent to the key holder and the value the key holder
released. Against CKKS the release is the approximate decryption, i.e. exactly
c0 + c1·s mod q with the encryption error inside it, so s = (release − c0)/c1 is
one linear solve (pointwise in the NTT domain), after which every single upload
decrypts. Against the old code (commit 2891f77) this recovered the key from one
round and decrypted a single upload.

Under BFV the key holder releases only the exact integer sum M. The best the
aggregator can put on the right-hand side is Δ·M; the truth is Δ·M + e with the
error e unknown and far larger than one, so the same solve gives a "key" that is
not ternary and fails to decrypt another client's upload. The attack runs on
real TenSEAL objects (coefficients read from SEAL's own serialization); a
synthetic control shows that the solver does recover the key whenever the
error is part of the release, so its failure here is due to the release.
"""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts
import tenseal.sealapi as sealapi
from he_lattice import Negacyclic, centred, crt, seal_polys

from fedrecgel_secure.privacy.secagg import BFVParams, FixedPoint, make_session
from fedrecgel_secure.privacy.secagg.bfv.wire import decode_upload
from fedrecgel_secure.privacy.secagg.identity import Envelope

N = 8192
DIM = N - 1  # one ciphertext per upload (its last slot holds the aggregate tag)
CLIENTS = [0, 1, 2, 3, 4]
GRID = FixedPoint()


def _solve_key(ntts, c0, c1, rhs):
    """s = (rhs − c0) / c1 per prime, in the NTT domain: the Li–Micciancio linear solve."""
    return [
        (ntt.forward(r) - ntt.forward(a)) * ntt.inv(ntt.forward(b)) % ntt.q for ntt, a, b, r in zip(ntts, c0, c1, rhs)
    ]


def _decrypt_with(ntts, key_hat, c0, c1, t):
    """BFV decryption with a guessed key: round(t/q · [c0 + c1·s]_q) mod t, coefficient by coefficient."""
    primes = [ntt.q for ntt in ntts]
    q = int(np.prod([int(p) for p in primes], dtype=object))
    parts = [ntt.inverse((ntt.forward(a) + ntt.forward(b) * s) % ntt.q) for ntt, a, b, s in zip(ntts, c0, c1, key_hat)]
    return [((t * v + q // 2) // q) % t for v in crt(parts, primes)]


def _key_coefficients(ntts, key_hat):
    primes = [ntt.q for ntt in ntts]
    q = int(np.prod([int(p) for p in primes], dtype=object))
    return centred(crt([ntt.inverse(s) for ntt, s in zip(ntts, key_hat)], primes), q)


@pytest.fixture(scope="module")
def observed():
    """Everything the aggregator sees in two rounds: aggregate, release, and the next round's uploads."""
    session = make_session("bfv", DIM, CLIENTS, min_clients=3, params=BFVParams(), encoding=GRID)
    rng = np.random.default_rng(0)
    seen = {}

    def keep(round_idx):
        def intercept(client, payload):
            seen[round_idx, client] = payload
            return payload

        return intercept

    xs0 = {c: rng.normal(0.0, 1.0, DIM) for c in CLIENTS}
    # the aggregate the aggregator forwards is the sum of what it received; rebuild it from the uploads
    released = session.run_round(0, xs0, intercept=keep(0)).total
    xs1 = {c: rng.normal(0.0, 1.0, DIM) for c in CLIENTS}
    session.run_round(1, xs1, intercept=keep(1))
    agg = session.aggregator
    ctx = agg.context

    def vector(round_idx, clients):
        total = None
        for c in clients:
            (vec,) = decode_upload(Envelope.parse(seen[round_idx, c]).body, ctx, agg.params, DIM, c)
            total = vec if total is None else total + vec
        return total

    def oracle(round_idx, clients):
        """The full slot values, tag included, decrypted with the secret key: more than the aggregator gets."""
        secret = ts.bfv_vector_from(session.key_holder._ctx, vector(round_idx, clients).serialize())
        return np.array(secret.decrypt(), dtype=np.int64)

    def ciphertext(round_idx, clients):
        ct = vector(round_idx, clients).ciphertext()[0]
        polys = seal_polys(ct, 2, N, agg.params.data_primes)
        assert (int(polys[0, 0, 0]), int(polys[1, 0, 0])) == (ct.data(0), ct.data(1))  # parsed the right bytes
        return polys

    primes = [m.value() for m in ctx.seal_context().data.first_context_data().parms().coeff_modulus()]
    # the parse is coherent: the aggregate's polynomials are the sums of the uploads' mod each prime
    parts = [ciphertext(0, [c]).astype(object) for c in CLIENTS]
    for k, p in enumerate(primes):
        assert (sum(x[:, k] for x in parts) % p == ciphertext(0, CLIENTS)[:, k].astype(object)).all()
    return {
        "session": session,
        "ctx": ctx,
        "t": agg.params.plain_modulus,
        "primes": primes,
        "released": released,
        "aggregate": ciphertext(0, CLIENTS),
        "victim": ciphertext(1, [3]),
        "aggregate_slots": oracle(0, CLIENTS),
        "victim_slots": oracle(1, [3]),
    }


def _plaintext_coefficients(ctx, t, ints):
    """The BFV plaintext polynomial (coefficients mod t) of slot values ``ints`` — public batch encoding."""
    encoder = sealapi.BatchEncoder(ctx.seal_context().data)
    plain = sealapi.Plaintext()
    encoder.encode([int(v) for v in ints], plain)
    return [plain[i] % t for i in range(plain.coeff_count())] + [0] * (N - plain.coeff_count())


def test_the_released_bfv_sum_does_not_yield_the_key(observed):
    o = observed
    t, primes = o["t"], o["primes"]
    q = int(np.prod([int(p) for p in primes], dtype=object))
    ntts = [Negacyclic(N, p) for p in primes]
    # what was released: the exact sum on the grid. Give the aggregator even the tag slot it never
    # sees, so that the attack fails for want of the error alone; M is the plaintext polynomial.
    ints = o["aggregate_slots"]
    assert np.array_equal(GRID.decode(ints[:DIM]), o["released"])
    m = _plaintext_coefficients(o["ctx"], t, ints)
    delta_m = [(q * v + t // 2) // t for v in m]  # the aggregator's best right-hand side: Δ·M (the error is unknown)
    c0, c1 = o["aggregate"][0], o["aggregate"][1]
    key_hat = _solve_key(ntts, c0, c1, [[v % p for v in delta_m] for p in primes])
    key = _key_coefficients(ntts, key_hat)
    ternary = sum(1 for k in key if -1 <= k <= 1)
    guess = _decrypt_with(ntts, key_hat, o["victim"][0], o["victim"][1], t)
    truth = _plaintext_coefficients(o["ctx"], t, o["victim_slots"])
    right = sum(1 for a, b in zip(guess, truth) if a == b)
    print(f"BFV: solved key has {ternary}/{N} ternary coefficients; victim plaintext coefficients right: {right}/{N}")
    assert ternary < N // 100  # a real SEAL key is entirely ternary
    assert right < N // 100  # the victim's upload does not decrypt


def test_control_the_solver_recovers_the_key_when_the_release_contains_the_error(observed):
    """The same solve on an RLWE sample whose decryption is released with its error, as CKKS does: it works."""
    t, primes = observed["t"], observed["primes"]
    q = int(np.prod([int(p) for p in primes], dtype=object))
    ntts = [Negacyclic(N, p) for p in primes]
    rng = np.random.default_rng(1)
    s = rng.integers(-1, 2, N)
    s_hat = [ntt.forward(s) for ntt in ntts]

    def encrypt(msg):  # symmetric RLWE: c0 = Δm + e − c1·s
        c1 = [rng.integers(0, p, N, dtype=np.uint64) for p in primes]
        e = rng.normal(0, 3.2, N).round().astype(np.int64)
        body = [(q * int(v) + t // 2) // t for v in msg]
        c0 = [
            ntt.inverse((ntt.forward([(b + int(x)) % p for b, x in zip(body, e)]) - ntt.forward(c) * sh) % p)
            for ntt, c, sh, p in zip(ntts, c1, s_hat, primes)
        ]
        return c0, c1, [(b + int(x)) % q for b, x in zip(body, e)]

    m = rng.integers(0, t, N)
    c0, c1, approximate = encrypt(m)  # ``approximate`` = c0 + c1·s: what an approximate decryption reveals
    victim = rng.integers(0, t, N)
    v0, v1, _ = encrypt(victim)
    key_hat = _solve_key(ntts, c0, c1, [[v % p for v in approximate] for p in primes])
    assert _key_coefficients(ntts, key_hat) == [int(x) for x in s]
    assert _decrypt_with(ntts, key_hat, v0, v1, t) == [int(x) for x in victim]
    exact_only = [(q * int(v) + t // 2) // t for v in m]  # what BFV releases: no error
    key_hat = _solve_key(ntts, c0, c1, [[v % p for v in exact_only] for p in primes])
    assert _decrypt_with(ntts, key_hat, v0, v1, t) != [int(x) for x in victim]


def test_ckks_is_refused_everywhere():
    from fedrecgel_secure.errors import BadInputError
    from fedrecgel_secure.privacy.secagg.bfv.wire import load_context

    ckks = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=8192, coeff_mod_bit_sizes=[52, 57])
    with pytest.raises(BadInputError, match="approximate decryptions leak the key"):
        load_context(ckks.serialize(), "a context")
    with pytest.raises(BadInputError, match="Li and Micciancio"):
        make_session("ckks", 10, [1, 2], min_clients=2)
