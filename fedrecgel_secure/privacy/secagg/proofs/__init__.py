"""Proofs that a client's update is valid, checked by servers that hold only shares of it (issue 50: client updates
checked inside the secure sum).

:mod:`.field`: the VDAF specification's prime fields and their NTT; :mod:`.flp`: the fully linear proof of
Boneh et al. (CRYPTO 2019); :mod:`.pine`: PINE's circuit for an L2 norm bound with its wraparound tests. This is
the plain path, in Python integers; the scheme that uses it is the two-server DPF (docs/privacy/input-checks.md
says how, and what is built).
"""
