"""A deployment's node: the Flower relay, the resident engine, the handlers and the users' protocol roles.

Imports nothing itself: the relay (:mod:`.clientapp`) must load without torch, and it lives here.
"""
