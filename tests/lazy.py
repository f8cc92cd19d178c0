"""``tf`` for test modules: TensorFlow imported on the first use of one of its names.

A test module's ``import tensorflow as tf`` runs when pytest collects it, in every tier: the
fast tier (``-m "not slow"``) would pay seconds for TensorFlow it never runs, and could not
see a fast test that starts it (``tiers.py``). ``from lazy import tf`` reads the same.
"""
from __future__ import annotations

import types


class LazyModule:
    """Stands for the module ``name`` and imports it when one of its names is first looked up."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # pytest's collection, copy and inspect probe these: no import for them
            raise AttributeError(attr)
        module: types.ModuleType = __import__(self.name)  # an import statement's way: tiers.py sees it
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<{self.name}, imported on first use>"


tf = LazyModule("tensorflow")
