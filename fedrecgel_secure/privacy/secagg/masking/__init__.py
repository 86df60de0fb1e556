"""Secure aggregation by pairwise masking (Bonawitz et al., CCS 2017; SecAgg+, Bell et al., CCS 2020).

Each client i encodes its vector on the shared fixed-point grid
(:mod:`..fixedpoint`: g_i = rint(x_i · 2^f) plus its DP noise share, if any,
clipped to ±R·2^f), reads the integers in the ring Z_{2^64}, and uploads

    y_i = g_i + PRG(b_i) + Σ_{j ∈ P(i), j > i} PRG(s_ij) − Σ_{j ∈ P(i), j < i} PRG(s_ij)   (mod 2^64)

where b_i is a fresh private seed, s_ij = HKDF(X25519(s_i, s_j)) a seed shared
with neighbour j, P(i) the neighbours whose shares i holds, and PRG the
AES-128-CTR keystream read as little-endian uint64. Over the survivors the
pairwise terms cancel, so once the aggregator has removed every PRG(b_i) the
sum is exactly Σ g_i mod 2^64 (plus central noise on the grid, if asked); it is
read as a signed integer and decoded. Exactness needs the sum to stay inside
the signed 64-bit range (:meth:`FixedPoint.check_capacity`).

Neighbours. N(i) comes from a k-regular graph that every party derives from the
cohort (the clients whose adverts the aggregator broadcast) and the public
per-attempt round seed: the clients are ordered by SHA-256(seed, id) on a ring
and each is joined to the k/2 nearest on either side (a Harary graph on a
pseudorandom permutation, as in SecAgg+). ``degree="all"`` is the complete
graph of Bonawitz et al.; ``"secagg+"`` uses k = 2⌈log2 n⌉; ``"auto"``
(default) is complete up to 32 clients and SecAgg+ above. An odd k is rounded
up to even. t is the Shamir threshold (default ⌊k/2⌋ + 1).

Steps of one attempt. Every message is a signed envelope (:mod:`..identity`):
the clients' under their identity keys, the aggregator's under its
:class:`~..identity.ServerIdentity` (a separate signature domain), which every
client checks; a client that finds any check failing raises
:class:`~..errors.ProtocolViolation`, forgets the attempt and counts as dropped.

0. announce (server, signed): (round, fresh 16-byte seed).
1. advertise: client i sends X25519 public keys c_i (to encrypt shares) and s_i
   (for masks). An all-zero or low-order key is rejected (``bad_key``).
2. cohort (server, signed): the adverts. A client checks that it is listed,
   that every member is a known client and that there are at least
   ``min_clients``; it then Shamir-shares b_i and the s_i private key among its
   neighbours with threshold t, each pair of shares encrypted to neighbour j
   with ChaCha20-Poly1305 under HKDF(X25519(c_i, c_j), i → j), with the
   digest of the cohort i saw as associated data. Once per attempt.
3. inbox (server, signed, names its recipient): a client accepts shares only
   from its neighbours and needs at least t of them, then masks with exactly
   those partners P(i) and uploads y_i. Once per attempt.
4. consistency check (server, signed): the survivor set U3 (who uploaded). A
   client checks that it is in U3, that U3 lies in the cohort, has at least
   ``min_clients`` members and at least t of its partners P(i); it signs
   (cohort, U3) once, and refuses any other U3 or new attempt of the round.
5. unmask request (server, signed): U3 and the forwarded signatures. A client
   needs T = ⌊f·n⌋ + 1 valid signatures of cohort members on its own
   (cohort, U3) (``MaskingParams.consistency`` = f, n = cohort size); then,
   once only, it reveals for each partner the s-share if the partner is not
   in U3, the b-share if it is in U3 and its own signature on U3 is among
   those forwarded (so it checked its partners), and never both. With t shares
   the aggregator recovers b_i for survivors and s_i for dropouts and outputs
   the survivors' exact sum. A client that drops out between its upload and
   its confirmation therefore makes the attempt fail (``below_threshold``).

A round is skipped (:class:`RoundSkipped`, nothing committed) if fewer than
``min_clients`` clients remain at any step, fewer than T confirm the survivor
set, or some needed secret has fewer than t shares. Fresh keys and seeds per
attempt mean a retried round never reuses a mask, and binding the round seed
into every signature stops messages of one attempt being replayed into another.

Guarantees. c = number of colluding clients, c_v = those among client v's
neighbours; "exposed" means the server learns x_v itself. t > k/2 (the
default threshold) is assumed throughout; n is the cohort size, T = ⌊f·n⌋ + 1.

(a) Honest-but-curious server: it learns only the survivors' sum, one sum per
    connected component of the graph on the survivors (one component for the
    complete graph; with t > k/2 and the ring graph, a survivor set in which
    every survivor keeps t partners stays connected), and nothing if fewer than
    ``min_clients`` survive. With c colluding clients, v is exposed iff
    c_v ≥ t (they hand over v's s-key shares while the others reveal its
    b-share), or every honest partner j of v is itself exposed (c_j ≥ t); in
    the complete graph both conditions read c ≥ t.
(b) Malicious server, no colluding clients: it picks the cohort (at least
    ``min_clients`` known clients) and the survivor set, and may show disjoint
    groups different cohorts. Shares are bound to the cohort their sender saw
    and the consistency check fixes one survivor set per cohort view, so each
    client's upload is unmasked in at most one sum, over a set of at least
    ``min_clients``; a b-share is revealed only for a client that itself
    signed that set, so only after it checked that it keeps t partners in it.
    The server obtains sums over disjoint client sets of its choosing, never a
    single upload.
    Per attempt, that is: a client that uploaded but was never sent the
    consistency request takes part in a new attempt of the same round with the
    same input (one that signed a survivor set refuses). The trainer moves to
    a new round, with new inputs, after a skip; a caller that retries a round
    with the same inputs can be given two sums over different sets.
(c) Malicious server and c colluding clients: while c < 2T − n every honest
    client of one cohort view that releases shares saw the same survivor set
    (two sets need T signatures each, so 2T − n common signers, at least one
    of them honest). Then v is exposed iff c_v ≥ t, or the server can fill
    the t partners v must keep in U3 with colluders and honest partners j
    that are exposed themselves (c_j ≥ t; it declares the others dropped);
    in the complete graph both read c ≥ t. n is the cohort the server chose, so it may pick
    the smallest allowed cohort (``min_clients``, where 2T − n ≈ n/3 at
    f = 2/3). SecAgg+ residual: the server also picks the round seed and the
    cohort, hence the graph, and can search for one that places t colluders
    around a chosen victim, which needs only t colluders, not a fraction of
    the cohort. Under a malicious-server threat model use the complete graph
    (``degree="all"``: every client's neighbours are the whole cohort, so
    c_v = c and t > n/2).
(d) Network attacker (server and clients honest): every message is signed and
    bound to the session tag, round, attempt seed and step, so it can only
    drop, delay or replay messages; replayed client messages are rejected by
    the server (``replay``, ``wrong_round``, ``duplicate_client``, or a
    signature that fails for another attempt), and a replayed or forged
    server message makes that client drop out of the attempt, no worse than
    dropping its messages.

The server does see the survivors' sum without noise, so central DP noise
added here hides the sum only from those the result is given to (use BFV, whose key holder adds it, or
noise added by clients, to hide it from the aggregator too). The wire formats
are in :mod:`.wire`, the roles in :mod:`.client` and
:mod:`.aggregator`.
"""
