"""Secure aggregation with exact homomorphic encryption: TenSEAL BFV on the fixed-point grid.

Threat model, plainly. HE protects the clients' uploads from an
**honest-but-curious aggregator that does not collude with the key holder**:
the aggregator sees ciphertexts and the released sum, nothing else. A
*malicious* aggregator (one that forges or reorders what it forwards), or one
that colludes with the key holder, is out of scope: the key holder checks what
it can (below) and refuses the forgeries of finding 2 of issue #10, but a
malicious server is not what it is designed against.
Deployments that must resist a malicious server should use ``"masking"``
(:mod:`.masking`), which needs no key holder.

Binding proofs to ciphertexts. Each client signs SHA-256 of its ciphertext
bytes (in a group, :class:`BFVGroup`, the group's one ciphertext), and each
ciphertext carries in its last slot a linearly homomorphic tag
of its data (:mod:`.tags`) under keys shared only by that client and the key
holder. The key holder receives only the summed ciphertext, checks the
signatures (round-bound, distinct, at least ``min_clients``) and, after
decrypting, that the tags add up to those of exactly the clients the proofs
name; otherwise it releases nothing. Having the key holder re-add the signed
uploads itself would be as cheap (about 0.3 ms per ciphertext here, 2 s per
FilmTrust round) but would hand it every single ciphertext with the key.
Residuals: a refused forgery has still been decrypted by the key holder, which
so may see one upload (it never releases it); an aggregator colluding with
clients can fill their places with values it knows, so the release reveals the
honest clients' sum only down to ``min_clients`` minus the colluders (as for
any secure sum); a forged tag passes with probability about 1/t ≈ 2^-59.

Roles:

* :class:`~.keyholder.KeyHolder` creates the BFV key pair and keeps the
  secret key; it publishes a *public* context (public key only). It releases
  at most one aggregate per round, of the dimension registered when it was
  created, carrying at least ``min_clients`` distinct, valid contribution
  proofs of that round whose tags match the decrypted sum, and it adds the
  central DP noise itself.
* :class:`BFVClient` puts its vector on the shared fixed-point grid
  (:class:`..fixedpoint.FixedPoint`, the same integers masking sums), tags
  them, encrypts them as BFV plaintexts mod the prime t, and signs SHA-256 of
  the ciphertext bytes (the envelope of :mod:`..identity`).
* :class:`BFVGroup` is several clients of one host (a deployment's node): their
  grid vectors added up, tagged with all their pads, encrypted once and signed
  by each of them; it decrypts to exactly what their single uploads would.
* :class:`BFVAggregator` holds only the public context; it checks each envelope
  (or group), adds the ciphertexts as they arrive and forwards the sum with the
  proofs (client id, digest of the ciphertext bytes it signed, signature).

Why BFV and not CKKS. CKKS decryption is approximate: the decrypted value is
c0 + c1·s *including* the encryption error, so whoever receives it can solve a
linear system for the secret key s (Li and Micciancio, Eurocrypt 2021). BFV
decryption rounds the error away and the key holder releases only the exact
integer sum decoded on the grid, so the release equals Σ m_i and carries no
information about the error: the linear system has the unknown, large error
term on its right-hand side (see tests/attacks/test_he_key_recovery.py).
Because the grid is the masking grid, HE and masking release bit-identical
aggregates.

Wire formats (:mod:`.wire`; body of a ``Kind.HE_UPLOAD`` envelope)::

    upload:    b"BFV1" | dim u32 | n_chunks u32 | (len u32 | TenSEAL BFVVector)*
    aggregate: b"BFA1" | round u64 | dim u32 | n u32 | proof*n
               | n_chunks u32 | (len u32 | BFVVector)*
               where proof = client u32 | SHA-256(upload body) | signature (100 bytes)
    bound:     b"BFA2" | round u64 | dim u32 | n u32 | participants u32 | digest 32 | proof*n | (as BFA1)

Binding (a deployment). A node's users sign their group's ciphertext under a
:class:`~.wire.Binding`: the digest of the model and DP settings their node
was sent, and the sample their noise shares were sized for. The aggregator
sums only partials of one binding, and the key holder verifies every proof
under the binding the aggregate states: users sent different models (model
inconsistency) cannot be summed together, and under distributed noise it
decrypts only an aggregate of exactly the users the shares were sized for.

Parameters. N = 8192, coefficient moduli (60, 60, 60) bits (180 of the 218 the
HomomorphicEncryption.org standard allows for 128-bit security at N = 8192;
the last prime is SEAL's key-switching prime, so ciphertexts live mod 120
bits), plain modulus t the largest 59-bit prime ≡ 1 mod 2N (SEAL's batching
needs t ≡ 1 mod 2N; it rejects 60 bits). One ciphertext packs N − 1 = 8191
grid integers and their tag; an upload is about 32 bytes per value.

Range. The sum is exact while every coordinate satisfies |Σ g_i| < t/2;
:meth:`.wire.ContextInfo.check_capacity` (run when the key holder is created,
for every registered client) refuses any setting where
``max_clients`` clipped values plus 10σ of central noise could reach it, and
where the BFV noise of that many summed ciphertexts could reach q/(2t).
"""
