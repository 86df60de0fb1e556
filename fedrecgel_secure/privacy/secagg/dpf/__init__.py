"""Distributed point functions (Boyle, Gilboa, Ishai, CCS 2016): additive shares of a vector that is zero but in one
row, in two keys of size O(log rows) each, neither of which says which row or what it holds.

A client that touched row ``alpha`` of a table with value ``beta`` (a row of integers on the fixed-point grid, in
Field64 or Z_2^32) gives one key to each of two servers that do not collude; each server expands its key over every row
(:func:`.point.eval_full`) and adds what it gets over the clients, and the two sums add up to the sum of the
clients' rows, exactly. The tree's pseudorandom generator is fixed-key AES-128 (:mod:`.prg`).

The scheme ``"dpf"``: :mod:`.params` (the budget R and the rule for a client with more rows), :mod:`.sparse` (the
public buckets, cuckoo placement, a server's expansion; :mod:`.expand_torch` the same on a GPU, with AES in torch
in :mod:`.aes_torch`), :mod:`.wire` (the upload's bytes), :mod:`.client`,
:mod:`.servers` (the aggregator and the key holder, and their check of each client's keys), :mod:`.norm` (the norm
proof each upload carries, checked on the two servers' shares), :mod:`.group` (the values' arithmetic) and
:mod:`.session` (all roles in one process). Threat model: the two servers follow the protocol and do not collude;
colluding, they read every client's rows. A malicious client can add any vector within the clip norm where the norm
check is on (:mod:`.norm`: each upload proves its L2 norm, and both servers drop one whose proof fails); without
it, any values in at most ⌈1.5·R⌉ rows (one a bucket) and the dense part, as under masking or BFV it can add any
vector: that biases the model, not another client's privacy, since the key holder's noise does not depend on the
clients. It cannot put two rows in one key (the servers' digests of leaf proofs differ and both drop it), nor have
a replayed, moved or swapped upload or box accepted.
"""
