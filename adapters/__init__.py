"""Framework adapters: one module per framework behind the `Trainer` contract in base.py.

Importing this package imports no framework; see registry.py for the list of adapters.
"""
