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
