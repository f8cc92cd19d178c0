"""Fixtures and pytest hooks only; what tests share besides fixtures is in ``helpers.py``."""
from __future__ import annotations

import pathlib

import pytest
from helpers import REPO

from beam_prep.write.plan.config import PROGRESS_INTERVAL_ENV

# A real GCS server on loopback for gs:// tests: the test harness in gcs_harness/.
pytest_plugins = ["gcs_harness.server", "tiers"]


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    return REPO


@pytest.fixture(autouse=True)
def _children_keep_temp_files_here(tmp_path_factory, monkeypatch):
    """Child processes write temp files (a failed or killed job's log) in the test's own folder."""
    monkeypatch.setenv("TMPDIR", str(tmp_path_factory.mktemp("tmp")))


@pytest.fixture(autouse=True)
def _no_progress_line_for_a_slow_machine(monkeypatch):
    """A run prints a progress line only where its test asks (``--progress_interval``): a small run
    under load lasts past the default interval, and its output must not depend on that."""
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "86400")


@pytest.fixture(scope="session")
def pillow_images():
    """Pillow's own test images (``real_images``): downloaded once, then from the cache.

    No registry and no cache is a failure, not a skip: CI has the registry, and a
    skipped differential test looks like a passed one.
    """
    from real_images import CorpusUnavailable, pillow_corpus

    try:
        return pillow_corpus()
    except CorpusUnavailable as e:
        why = str(e)
    pytest.fail(why, pytrace=False)


# The modules that take longest, longest first: xdist starts them before the rest, so that
# none of them is the last thing a worker runs while the others wait. The docs pages are
# each their own unit (any worker runs any page; the longest page first); the other modules
# stay whole (loadfile), so that a module's fixtures are built once.
LONGEST_FIRST = (
    "tests/docs/test_examples.py::test_the_guides_run_in_reading_order_in_one_folder",
    "tests/write/test_resume.py",
    "tests/write/test_resume_variants.py",
    "tests/docs/test_examples.py::test_page_examples_run[docs/guides/inspect-verify-bench.md]",
    "tests/write/test_gcs_pipeline.py",
    "tests/write/test_publish_kills.py",
    "tests/docs/test_examples.py::test_page_examples_run",
    "tests/write/test_real_images.py",
    "tests/write/test_resample_command.py",
    "tests/cli/test_cli.py",
    "tests/reader/test_reader.py",
    "tests/write/test_formats.py",
    "tests/write/test_hostile.py",
)
PAGE_TEST = "tests/docs/test_examples.py::test_page_examples_run["
# Every guide in turn in one folder: the longest unit of all, of its own.
READING_ORDER_TEST = "tests/docs/test_examples.py::test_the_guides_run_in_reading_order_in_one_folder"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, but each docs page a unit of its own and the longest modules first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith((PAGE_TEST, READING_ORDER_TEST)) else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first assignment: the queue is whole
                def rank(scope: str) -> int:
                    return next((i for i, s in enumerate(LONGEST_FIRST) if scope.startswith(s)), len(LONGEST_FIRST))
                units = sorted(self.workqueue.items(), key=lambda unit: rank(unit[0]))  # stable: xdist's order next
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker a core, and one more. Much of a test's time is a process starting,
    a child waited for or a server answering; with one worker a core, the cores sat idle then."""
    import os

    return len(os.sched_getaffinity(0)) + 1
