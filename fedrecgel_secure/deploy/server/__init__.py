"""The deployment's server: the ServerApp, its round loop over the nodes and the protocols' server sides.

Imports nothing itself, so that naming a module here loads only that module.
"""
