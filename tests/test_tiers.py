"""The two tiers' own check (tiers.py), run on small test files in a pytest inside this one.

Marks follow from what a test uses, and an unmarked test that starts something anyway fails
naming it: a subprocess, a Beam pipeline, the GCS server, the real images or TensorFlow (a
stand-in module here, so that TensorFlow's seconds are not spent, and stay unspent for the
fast tier's later tests).
"""
from __future__ import annotations

import pytest
import tiers

pytest_plugins = ["pytester"]

PROBE = "heavy_probe"  # stands for tensorflow: a module whose first import counts as starting something


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A folder with the tiers plugin, where importing PROBE counts as TensorFlow does."""
    pytester.makeini("[pytest]\nmarkers =\n    slow: starts something\n")
    pytester.makeconftest('pytest_plugins = ["tiers"]\n')
    pytester.makepyfile(**{PROBE: "WEIGHT = 1\n"})
    pytester.syspathinsert()
    monkeypatch.setitem(tiers.SLOW_IMPORTS, PROBE, "a heavy probe")
    monkeypatch.delitem(__import__("sys").modules, PROBE, raising=False)
    return pytester


def fast_tier(pytester: pytest.Pytester) -> list[str]:
    """The test ids ``-m "not slow"`` keeps."""
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-m", "not slow")
    return sorted(line.split("::")[1] for line in result.outlines if "::" in line)


def test_what_a_test_uses_marks_it_slow(inner):
    inner.makepyfile(test_uses='''
import subprocess

import pytest


@pytest.fixture
def listing():
    return subprocess.run(["ls"], capture_output=True)


def through_a_helper():
    return subprocess.check_output(["ls"])


def test_a_fixture_starts_a_process(listing):
    pass


def test_a_helper_starts_a_process():
    through_a_helper()


def test_a_pipeline_built_from_a_local_import():
    import apache_beam as beam

    with beam.Pipeline() as p:
        p | beam.Create([1])


def test_a_pipeline_class_imported_in_the_test():
    from apache_beam.testing.test_pipeline import TestPipeline

    TestPipeline().run()


def test_the_probe_imported_in_the_test():
    import heavy_probe

    assert heavy_probe.WEIGHT


def test_the_real_images(pillow_images):
    pass


def test_pure_logic():
    assert sorted([2, 1]) == [1, 2]
''')
    inner.makeconftest('pytest_plugins = ["tiers"]\n\nimport pytest\n\n\n'
                       '@pytest.fixture(scope="session")\ndef pillow_images():\n    return None\n')
    assert fast_tier(inner) == ["test_pure_logic"]


@pytest.mark.parametrize("body,started", [
    ("os.popen('true').read()", "a subprocess (true)"),
    ("importlib.import_module('apache_beam').Pipeline().run()", "a Beam pipeline (apache_beam.Pipeline.run)"),
    ("importlib.import_module('gcs_harness.server').running_gcs_server(None)", "the GCS test server"),
    ("importlib.import_module(PROBE)", "a heavy probe (import heavy_probe)"),
], ids=["subprocess", "pipeline", "gcs server", "tensorflow"])
def test_an_unmarked_test_that_starts_something_fails_naming_it(inner, body, started):
    inner.makepyfile(test_hidden=f'''
import importlib
import os

import pytest

PROBE = "{PROBE}"


def test_hidden():
    {body}


@pytest.mark.slow
def test_marked():
    {body}
''')
    assert fast_tier(inner) == ["test_hidden"], "the scan must not see through this test"
    result = inner.runpytest_inprocess("-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        f"*test_hidden.py::test_hidden is not marked slow but started*{started}*mark it @pytest.mark.slow*"])


def test_reading_the_real_images_unmarked_fails(inner, tmp_path, monkeypatch):
    """A corpus already in the cache is read without a download: the read alone counts."""
    (tmp_path / "pillow-0.0" / "png").mkdir(parents=True)
    (tmp_path / "pillow-0.0" / "png" / "a.png").write_bytes(b"")
    monkeypatch.setenv("BEAM_PREP_TEST_CACHE", str(tmp_path))
    inner.makepyfile(test_reads='''
import importlib


def test_reads():
    assert importlib.import_module("real_images").pillow_corpus("0.0").names == ("png/a.png",)
''')
    result = inner.runpytest_inprocess("-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*not marked slow but started the real-image set (real_images.pillow_corpus)*"])


def test_a_fixture_that_starts_something_fails_the_first_unmarked_test_in_its_setup(inner):
    inner.makepyfile(test_fixture='''
import importlib
import os

import pytest


@pytest.fixture(scope="module")
def listing():
    return os.popen("true").read()


def test_first(listing):
    pass


def test_second(listing):
    pass
''')
    result = inner.runpytest_inprocess("-q")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test_fixture.py::test_first is not marked slow but started*a subprocess (true)*"])


def test_a_module_that_imports_the_probe_when_collected_fails_to_collect(inner):
    inner.makepyfile(test_top=f'''
import {PROBE}


def test_anything():
    assert {PROBE}.WEIGHT
''')
    result = inner.runpytest_inprocess("-q")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*test_top.py imports {PROBE} when pytest collects it*from lazy import tf*"])


def test_a_test_that_starts_nothing_passes_in_both_tiers(inner):
    inner.makepyfile(test_quiet='''
def test_quiet():
    assert sorted([3, 1, 2]) == [1, 2, 3]
''')
    inner.runpytest_inprocess("-q").assert_outcomes(passed=1)
    inner.runpytest_inprocess("-q", "-m", "not slow").assert_outcomes(passed=1)


def test_importing_the_probe_counts_even_when_an_earlier_test_imported_it(inner):
    """Which test imports TensorFlow first depends on the order tests run in; the check must not."""
    inner.makepyfile(test_again=f'''
import pytest


@pytest.mark.slow
def test_first():
    __import__("{PROBE}")


def test_second():
    __import__("{PROBE}")
''')
    result = inner.runpytest_inprocess("-q")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*test_second is not marked slow but started a heavy probe (import {PROBE})*"])
