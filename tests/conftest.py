"""Fixtures and pytest hooks only; what tests share besides fixtures is in ``helpers.py``."""
from __future__ import annotations

import pathlib

import pytest

from helpers import REPO

# A real GCS server on loopback for gs:// tests: the test harness in gcs_harness/.
pytest_plugins = ["gcs_harness.server"]


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    return REPO
