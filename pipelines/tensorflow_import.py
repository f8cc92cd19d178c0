"""TensorFlow for the commands that read records (``verify``, ``bench``, ``inspect --grid``),
imported without the Keras optimizers it loads eagerly.

``import tensorflow`` ends by importing ``keras.src.optimizers``, which pulls in most of
Keras: about 1.7 s of a core's 6.5 s, so that a SavedModel's optimizers are registered
before one is loaded. These commands read records with ``tf.data`` and load no model, so
their import leaves that step out: TensorFlow skips it when the module cannot be imported
(its ``except ImportError``). Keras itself still imports later, if anything asks for
``tf.keras``. A library caller's process is untouched: only these commands call this.
"""
from __future__ import annotations

import sys

__all__ = ["EAGER_KERAS", "import_tensorflow"]

EAGER_KERAS = "keras.src.optimizers"  # what TensorFlow's __init__ imports at its end


def import_tensorflow() -> None:
    """Imports TensorFlow, unless it is already, without ``EAGER_KERAS``; that module is
    importable again afterwards."""
    if "tensorflow" in sys.modules or EAGER_KERAS in sys.modules:
        return
    sys.modules[EAGER_KERAS] = None  # type: ignore[assignment]  # the import system's "refused"
    try:
        import tensorflow  # noqa: F401
    finally:
        if sys.modules.get(EAGER_KERAS, False) is None:
            del sys.modules[EAGER_KERAS]
