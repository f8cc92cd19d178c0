"""TensorFlow for the commands that read records (``verify``, ``bench``, ``inspect --grid``),
imported without the Keras optimizers it loads eagerly.

``import tensorflow`` ends by importing ``keras.src.optimizers``, which pulls in most of
Keras (about a quarter of the import's CPU), so that a SavedModel's optimizers are registered
before one is loaded. These commands read records with ``tf.data`` and load no model, so
their import leaves that step out: TensorFlow skips it when the module cannot be imported
(its ``except ImportError``). Only where the installed TensorFlow's own source says so
(``guards_eager_keras``): another version imports as it always does. Keras itself still
imports later, if anything asks for ``tf.keras``. A library caller's process is untouched:
only these commands call this.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

__all__ = ["EAGER_KERAS", "guards_eager_keras", "import_tensorflow"]

EAGER_KERAS = "keras.src.optimizers"  # what TensorFlow's __init__ imports at its end

# The eager import as TensorFlow's __init__ writes it (2.21), in a try whose except takes ImportError.
_GUARDED = re.compile(r'try:\s*\n(?:[ \t]+[^\n]*\n){0,4}?[ \t]+importlib\.import_module\("keras\.src\.optimizers"\)'
                      r'\s*\nexcept \([^)]*\bImportError\b')


def guards_eager_keras(source: str) -> bool:
    """Whether TensorFlow's ``__init__`` source imports ``EAGER_KERAS`` where an ImportError is caught."""
    return _GUARDED.search(source) is not None


def import_tensorflow() -> None:
    """Imports TensorFlow, unless it is already, without ``EAGER_KERAS`` where its ``__init__``
    catches that import's failure; that module is importable again afterwards."""
    if "tensorflow" in sys.modules or EAGER_KERAS in sys.modules:
        return
    refused = _installed_guards()
    if refused:
        # The import system's "refused", checked before any parent package is imported. A finder
        # refusing it (as ``lean_imports``' refuses Beam's modules) is asked only once ``keras``'s
        # __init__ has started: part of Keras would be imported, and left behind half-imported.
        sys.modules[EAGER_KERAS] = None  # type: ignore[assignment]
    try:
        import tensorflow  # noqa: F401
    finally:
        if refused and sys.modules.get(EAGER_KERAS, False) is None:
            del sys.modules[EAGER_KERAS]


def _installed_guards() -> bool:
    try:
        spec = importlib.util.find_spec("tensorflow")
        origin = spec.origin if spec is not None else None
        return origin is not None and guards_eager_keras(pathlib.Path(origin).read_text(encoding="utf-8"))
    except (OSError, ValueError, ImportError):
        return False
