"""Starting and planning a deployment's processes: ``deploy local``, ``deploy plan``, TLS files, the SuperLink.

Imports nothing itself, so that ``fedrecgel deploy plan`` loads no Flower.
"""
