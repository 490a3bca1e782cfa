"""The bottom layer: what every other part and every command line needs before any framework or
third-party library exists — the per-framework environments (`core.envs`) and the conventions of
the command-line entry points (`core.cli`). Standard library only.

Layers, each importing only from itself and the ones before it:
core <- models <- analysis <- adapters <- launchers; bench and tests on top.
"""
