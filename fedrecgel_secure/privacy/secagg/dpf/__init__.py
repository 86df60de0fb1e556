"""Distributed point functions (Boyle, Gilboa, Ishai, CCS 2016): additive shares of a vector that is zero but in one
row, in two keys of size O(log rows) each, neither of which says which row or what it holds.

A client that touched row ``alpha`` of a table with value ``beta`` (a row of integers on the fixed-point grid, in
Z_2^64 or Z_2^32) gives one key to each of two servers that do not collude; each server expands its key over every row
(:func:`.point.eval_full`) and adds what it gets over the clients, and the two sums add up to the sum of the
clients' rows, exactly. The tree's pseudorandom generator is fixed-key AES-128 (:mod:`.prg`).
"""
