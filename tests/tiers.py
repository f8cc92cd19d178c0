"""The two test tiers: which tests are ``slow``, and the check that keeps the fast tier fast.

A test is slow when it starts a Beam pipeline, a subprocess, the GCS test server, TensorFlow
or a run on the real-image set. The mark follows from what a test uses: ``slow_reason`` reads
(without running) the test's code, the fixtures it requests and the functions and classes of
the test folder they call. What hides in library code (a command's ``main`` that runs a
pipeline) is caught when the test runs: ``watch`` sees every start, and an unmarked test that
started something fails, naming what it started. Registered by ``conftest.py`` as a plugin.
"""
from __future__ import annotations

import builtins
import contextlib
import dis
import functools
import inspect
import pathlib
import subprocess
import sys
import types
from collections.abc import Callable, Iterator

import apache_beam
import pytest
from lazy import LazyModule

# Fixtures that start something themselves, and what (found by the code scan too; named here
# for the message).
SLOW_FIXTURES = {"gcs_server": "the GCS test server", "pillow_images": "the real-image set"}
# Modules whose import in a test is TensorFlow starting (seconds, then a GB of memory).
SLOW_IMPORTS = {"tensorflow": "TensorFlow", "tensorflow_datasets": "TensorFlow"}


def _starters() -> dict[object, str]:
    """Objects whose use starts something, and what they start."""
    import gcs_harness.server
    import helpers
    import real_images
    from apache_beam.testing.test_pipeline import TestPipeline

    found: dict[object, str] = {
        apache_beam.Pipeline: "a Beam pipeline", TestPipeline: "a Beam pipeline",
        helpers.prepare_here: "a Beam pipeline (helpers.prepare_here)",
        gcs_harness.server.running_gcs_server: "the GCS test server",
        real_images.pillow_corpus: "the real-image set",
    }
    for obj, why in list(found.items()):  # the unwrapped originals, as modules imported them
        if hasattr(obj, "__tiers_original__"):
            found[obj.__tiers_original__] = why
    for name in ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"):
        found[getattr(subprocess, name)] = f"a subprocess (subprocess.{name})"
    return found


# --- reading what a test uses ----------------------------------------------------


class _Scan:
    """What a function starts, read from its bytecode and that of the test folder's functions it calls.

    A name it loads (a global, or one it imports itself) that is a starter, a TensorFlow module
    or ``lazy.tf`` answers; a function or class of the test folder is read in turn. Library code
    is not read: the run-time check covers it.
    """

    def __init__(self, roots: list[pathlib.Path]):
        self._roots = [str(r.resolve()) for r in roots]
        self._starters = _starters()
        self._done: dict[types.CodeType, str | None] = {}

    def _ours(self, code: types.CodeType) -> bool:
        return any(code.co_filename.startswith(r) for r in self._roots)

    def _of_object(self, obj: object) -> str | None:
        if isinstance(obj, LazyModule):
            return SLOW_IMPORTS.get(obj.name.split(".")[0])
        try:
            if obj in self._starters:
                return self._starters[obj]
        except TypeError:  # unhashable
            return None
        if isinstance(obj, types.ModuleType):
            top = obj.__name__.split(".")[0]
            return SLOW_IMPORTS.get(top)
        members = vars(obj).values() if isinstance(obj, type) else [obj]
        for member in members:
            if (why := self._of_function(member)) is not None:
                return f"{why} via {getattr(obj, '__qualname__', obj)}"
        return None

    def _of_function(self, obj: object) -> str | None:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        with contextlib.suppress(ValueError):
            obj = inspect.unwrap(obj)
        code = getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType) or not self._ours(code):
            return None
        return self._of_code(code, getattr(obj, "__globals__", {}))

    def _of_code(self, code: types.CodeType, globals_: dict) -> str | None:
        if code in self._done:
            return self._done[code]
        self._done[code] = None  # a cycle reads as "nothing"
        why = self._of_instructions(code, globals_) or next(
            (w for c in code.co_consts if isinstance(c, types.CodeType) if (w := self._of_code(c, globals_))), None)
        self._done[code] = why
        return why

    def _of_instructions(self, code: types.CodeType, globals_: dict) -> str | None:
        imported: dict[str, object] = {}  # names the function imports itself (import x as y, from x import y)
        source: object = None  # the module of the import statement being read
        pending: object = None  # what an import just gave, until it is stored under a name
        module: types.ModuleType | None = None  # the module just loaded, for its attribute
        for ins in dis.get_instructions(code):
            name = str(ins.argval)
            why = None
            if ins.opname == "IMPORT_NAME":
                if name.split(".")[0] in SLOW_IMPORTS:
                    return f"{SLOW_IMPORTS[name.split('.')[0]]} (import {name})"
                source = pending = sys.modules.get(name)
                continue
            if ins.opname == "IMPORT_FROM":
                pending = getattr(source, name, None)
                continue
            if ins.opname in ("STORE_FAST", "STORE_NAME", "STORE_DEREF") and pending is not None:
                imported[name], pending = pending, None
                continue
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF"):
                held = imported.get(name) if ins.opname in ("LOAD_FAST", "LOAD_DEREF") else \
                    globals_.get(name, getattr(builtins, name, None))
                why = self._of_object(held)
                module = held if isinstance(held, types.ModuleType) else None
                if why is None:
                    continue
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and module is not None:
                why = self._of_object(getattr(module, name, None))
            module = None
            if why is not None:
                return why
        return None


def slow_reason(item: pytest.Item, scan: _Scan) -> str | None:
    """What ``item`` starts, read from its fixtures and its code, or None."""
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        if name in SLOW_FIXTURES:
            return f"uses {name} ({SLOW_FIXTURES[name]})"
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and (why := scan._of_function(defs[-1].func)) is not None:
            return f"uses the fixture {name}, which starts {why}"
    function = getattr(item, "function", None)
    if function is not None and (why := scan._of_function(function)) is not None:
        return f"starts {why}"
    return None


# --- watching what a test starts ---------------------------------------------------

# What the test phase running now has started (the innermost one: a test of this check runs
# pytest inside a test).
_running: list[list[str]] = []


def _noting(what: Callable[..., str | None], original: Callable) -> Callable:
    @functools.wraps(original)
    def noted(*args, **kwargs):
        if _running and (started := what(*args, **kwargs)) is not None:
            _running[-1].append(started)
        return original(*args, **kwargs)
    noted.__tiers_original__ = original
    return noted


def _argv(self, args, *rest, **kwargs) -> str:
    shown = args if isinstance(args, (str, bytes)) else " ".join(str(a) for a in list(args)[:3])
    return f"a subprocess ({shown})"


def _slow_import(name: str, globals_=None, locals_=None, fromlist=(), level: int = 0) -> str | None:
    top = name.split(".")[0]
    importer = (globals_ or {}).get("__name__", "").split(".")[0]
    if level or top not in SLOW_IMPORTS or importer in SLOW_IMPORTS:  # TensorFlow importing itself
        return None
    return f"{SLOW_IMPORTS[top]} (import {top})"


def _install() -> None:
    """Wraps what starts things, once a process (a test of this check runs pytest inside pytest)."""
    import gcs_harness.server
    import real_images

    if hasattr(subprocess.Popen.__init__, "__tiers_original__"):
        return
    # Every import statement of TensorFlow, not only its first: which test imports it first
    # depends on the order tests run in, and the check must not.
    builtins.__import__ = _noting(_slow_import, builtins.__import__)
    subprocess.Popen.__init__ = _noting(_argv, subprocess.Popen.__init__)
    apache_beam.Pipeline.run = _noting(lambda *a, **k: "a Beam pipeline (apache_beam.Pipeline.run)",
                                       apache_beam.Pipeline.run)
    gcs_harness.server.running_gcs_server = _noting(lambda *a, **k: "the GCS test server",
                                                    gcs_harness.server.running_gcs_server)
    real_images.pillow_corpus = _noting(lambda *a, **k: "the real-image set (real_images.pillow_corpus)",
                                        real_images.pillow_corpus)


@contextlib.contextmanager
def watch() -> Iterator[list[str]]:
    """Collects what the block starts: processes, pipelines, the GCS server, TensorFlow."""
    started: list[str] = []
    before = {name for name in SLOW_IMPORTS if name in sys.modules}
    _running.append(started)
    try:
        yield started
    finally:
        _running.pop()
        started.extend(f"{what} (import {name})" for name, what in SLOW_IMPORTS.items()
                       if name in sys.modules and name not in before)


def unmarked_start_message(nodeid: str, started: list[str]) -> str:
    whats = list(dict.fromkeys(started))
    return (f"{nodeid} is not marked slow but started {'; '.join(whats)}: mark it @pytest.mark.slow "
            f"(a whole module: pytestmark = pytest.mark.slow), or keep it out of the fast tier's way")


# --- the hooks ---------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    _install()


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    roots = [config.rootpath / p for p in config.getini("testpaths")] or [config.rootpath]
    scan = _Scan(roots)
    for item in items:
        if item.get_closest_marker("slow") is None and (why := slow_reason(item, scan)) is not None:
            item.add_marker(pytest.mark.slow)
            item.user_properties.append(("slow", why))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[pytest.CollectReport]:
    """A test module that imports TensorFlow when collected fails to collect, in every tier."""
    before = {name for name in SLOW_IMPORTS if name in sys.modules}
    with watch():  # what collecting starts is collection's (a test of this check collects inside a test)
        report = yield
    new = [name for name in SLOW_IMPORTS if name in sys.modules and name not in before]
    if new and isinstance(collector, pytest.Module) and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid} imports {', '.join(new)} when pytest collects it, so every tier "
                           f"pays for it: import it inside the tests that use it (or: from lazy import tf)")
    return report


def _checked(item: pytest.Item) -> Iterator[None]:
    with watch() as started:  # a slow test's starts are its own, too: never an enclosing test's
        result = yield
    if started and item.get_closest_marker("slow") is None:
        pytest.fail(unmarked_start_message(item.nodeid, started), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _checked(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _checked(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _checked(item))
