"""TensorFlow for the commands that read records (``verify``, ``bench``, ``inspect --grid``,
``report``), imported without the modules it loads only in case a caller wants them.

``import tensorflow`` ends by importing ``keras.src.optimizers``, which pulls in most of
Keras (about a quarter of the import's CPU), so that a SavedModel's optimizers are registered
before one is loaded. On the way, TensorFlow Lite imports JAX where it is installed (Grain's
users have it), for a converter of JAX functions, and Keras imports pandas, to take a DataFrame
as training data. These commands read records with ``tf.data``: they load no model, convert no
JAX function and train on no DataFrame, so their import leaves those out, each where the
importing module catches the ImportError (``guards``: only where the installed package's own
source says so; another version imports as it always does). Each is importable again
afterwards: Keras itself still imports if anything asks for ``tf.keras``. A library caller's
process is untouched: only these commands call this.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re
import sys
from collections.abc import Mapping

__all__ = ["EAGER_KERAS", "LEFT_OUT", "guards", "guards_eager_keras", "import_tensorflow"]

EAGER_KERAS = "keras.src.optimizers"  # what TensorFlow's __init__ imports at its end

# Each module left out -> the source file (a package, then a path in it) that imports it, and that
# import as the file writes it (TensorFlow 2.21, Keras 3), in a try whose except takes ImportError.
LEFT_OUT: Mapping[str, tuple[str, str, re.Pattern[str]]] = {
    EAGER_KERAS: ("tensorflow", "__init__.py", re.compile(
        r'try:\s*\n(?:[ \t]+[^\n]*\n){0,4}?[ \t]+importlib\.import_module\("keras\.src\.optimizers"\)'
        r'\s*\nexcept \([^)]*\bImportError\b')),
    "jax": ("tensorflow", "lite/python/util.py", re.compile(
        r"try:\s*\n[ \t]+from jax import [^\n]*\nexcept \(?[^)\n]*\bImportError\b")),
    "pandas": ("keras", "src/trainers/data_adapters/array_slicing.py", re.compile(
        r"try:\s*\n[ \t]+import pandas\s*\nexcept \(?[^)\n]*\bImportError\b")),
}


def guards(module: str, source: str) -> bool:
    """Whether ``source`` (of ``LEFT_OUT[module]``'s file) imports ``module`` where an ImportError is caught."""
    return LEFT_OUT[module][2].search(source) is not None


def guards_eager_keras(source: str) -> bool:
    """Whether TensorFlow's ``__init__`` source imports ``EAGER_KERAS`` where an ImportError is caught."""
    return guards(EAGER_KERAS, source)


def import_tensorflow() -> None:
    """Imports TensorFlow, unless it is already, without each module of ``LEFT_OUT`` not imported
    yet whose importer catches that import's failure; those modules are importable again afterwards."""
    if "tensorflow" in sys.modules or EAGER_KERAS in sys.modules:
        return
    # The import system's "refused", checked before any parent package is imported. A finder
    # refusing it (as ``lean_imports``' refuses Beam's modules) is asked only once ``keras``'s
    # __init__ has started: part of Keras would be imported, and left behind half-imported.
    refused = [module for module in LEFT_OUT if module not in sys.modules and _installed_guards(module)]
    for module in refused:
        sys.modules[module] = None  # type: ignore[assignment]
    try:
        import tensorflow  # noqa: F401
    finally:
        for module in refused:
            if sys.modules.get(module, False) is None:
                del sys.modules[module]


def _installed_guards(module: str) -> bool:
    package, path, _ = LEFT_OUT[module]
    try:
        spec = importlib.util.find_spec(package)  # the top package's: nothing of it imported
        origin = spec.origin if spec is not None else None
        return origin is not None and guards(module, (pathlib.Path(origin).parent / path).read_text(encoding="utf-8"))
    except (OSError, ValueError, ImportError):
        return False
