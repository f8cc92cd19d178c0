"""The performance pages and the headline figures are renders of the committed benchmark results.

``python -m benchmarks.report`` renders docs/performance/ from benchmarks/pages/
and docs/performance/results/, and fills every ``<!-- figure: KEY -->`` marker of
README.md and docs/**/*.md; a committed page that differs from a render fails here.
"""
from __future__ import annotations

import copy
import json
import pathlib

import pytest
from helpers import REPO

from benchmarks.report import __main__ as report_main
from benchmarks.report import figures, render
from benchmarks.results import Recording


def test_committed_pages_are_a_render_of_the_committed_results():
    expected = render.expected_files(REPO)
    stale = [str(path.relative_to(REPO)) for path in render.differing(REPO, expected)]
    assert not stale, f"differ from a render (run python -m benchmarks.report): {stale}"


def test_every_page_in_the_nav_has_a_template():
    nav = (REPO / "mkdocs.yml").read_text()
    for template in (REPO / render.TEMPLATES).glob("*.md"):
        assert f"performance/{template.name}" in nav


def _run(images: int, seconds: float, cpu_seconds: float, psnr: float | None = 36.5) -> dict:
    return {"images": images, "seconds": seconds, "peak_rss_bytes": 550_000_000, "output_bytes": 300_000_000,
            "error": None, "details": {}, "cpu_seconds": cpu_seconds, "psnr": psnr,
            "images_per_s": images / seconds}


def _record(benchmark: str, results: dict) -> dict:
    return {"benchmark": benchmark, "command": f"python -m benchmarks.bench_{benchmark} --json out.json",
            "date": "2026-11-26T00:30:00+00:00",
            "machine": {"cpu": "Test CPU", "cores": 2, "ram_gib": 8.0, "platform": "Linux",
                        "load_average_before": [0.1, 0.2, 0.3], "load_average_after": [1.9, 1.0, 0.5]},
            "versions": {"python": "3.11.7", "beam-prep": "abc123", "pillow": "12.3.0", "numba": None},
            "results": results}


WRITER = _record("writer", {
    "img2dataset": "1.47.0",
    "limit": {"sample": 1500, "cores": 2, "serial_seconds": 1.5, "parallel_seconds": 0.8, "serial_cpu_seconds": 1.5,
              "failed": 0, "first_error": None, "per_core": 1000.0, "images_per_s": 2000.0,
              "parallel_images_per_s": 1875.0},
    "runs": [{"images": 20000, "seed": _run(20000, 40.0, 43.0, None), "ours": _run(20000, 16.0, 32.0)}],
    "peers": {"handwritten": _run(20000, 24.0, 46.0), "img2dataset": _run(20000, 30.0, 58.0)},
    "originals": [], "load_average": [1.9, 2.1],
})
READER = _record("reader", {"results": {"a": {"label": "(a) beam-prep reader", "images_per_s": [7000, 7400, 7200],
                                              "images_per_cpu_s": [3800, 3900, 3850]}}})


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    """A repository of one performance page, its results and a README quoting two figures."""
    (tmp_path / render.TEMPLATES).mkdir(parents=True)
    (tmp_path / render.TEMPLATES / "writer.md").write_text("# Writer\n\nWhat is measured.\n\n<!-- results: writer -->\n")
    (tmp_path / render.TEMPLATES / "index.md").write_text("# Performance\n\n<!-- figures -->\n")
    (tmp_path / render.RESULTS).mkdir(parents=True)
    for name, record in (("writer", WRITER), ("reader", READER)):
        (tmp_path / render.RESULTS / f"{name}.json").write_text(json.dumps(record))
    (tmp_path / "README.md").write_text(
        "Per CPU-second <!-- figure: writer.vs_handwritten_cpu -->9.99×<!-- /figure --> a hand-written script; "
        "<!-- figure: writer.cpu_ms_per_image -->0<!-- /figure --> ms an image.\n")
    return tmp_path


def test_a_render_shows_the_results_the_machine_and_the_versions(repo: pathlib.Path):
    assert report_main.main(["--root", str(repo)]) == 0
    page = (repo / "docs" / "performance" / "writer.md").read_text()
    # (c): 20,000 images in 16 s, 32 CPU-s; (a) 40 s; (g) 46 CPU-s.
    assert "| (c) beam-prep `pipelines.prepare_images` | 20,000 | 16.0 | 1,250.0 | — | 1.60 |" in page
    assert "| (a) seed notebook writer (tf.data, GZIP) | 20,000 | 40.0 | 500.0 | 2.50× | 2.15 | 1.34× |" in page
    assert "`python -m benchmarks.bench_writer --json out.json` on 2026-11-26 00:30 UTC" in page
    assert "Test CPU, 2 cores" in page and "0.10, 0.20, 0.30 before" in page
    assert "beam-prep abc123" in page and "numba" not in page.split("versions:")[1]
    readme = (repo / "README.md").read_text()
    assert "<!-- figure: writer.vs_handwritten_cpu -->1.44×<!-- /figure -->" in readme
    assert "<!-- figure: writer.cpu_ms_per_image -->1.60<!-- /figure -->" in readme
    index = (repo / "docs" / "performance" / "index.md").read_text()
    assert "| `reader.images_per_s` | 7,200 |" in index
    assert "| `launcher.seconds_2m` | not measured |" in index


def test_a_changed_result_changes_the_page_and_the_figures(repo: pathlib.Path, capsys):
    assert report_main.main(["--root", str(repo)]) == 0
    assert report_main.main(["--root", str(repo), "--check"]) == 0
    changed = copy.deepcopy(WRITER)
    changed["results"]["runs"][0]["ours"]["cpu_seconds"] = 40.0  # 2.00 ms an image
    (repo / render.RESULTS / "writer.json").write_text(json.dumps(changed))
    capsys.readouterr()
    assert report_main.main(["--root", str(repo), "--check"]) == 1
    err = capsys.readouterr().err
    assert "README.md differs" in err and "docs/performance/writer.md differs" in err
    assert report_main.main(["--root", str(repo)]) == 0
    assert "| (c) beam-prep `pipelines.prepare_images` | 20,000 | 16.0 | 1,250.0 | — | 2.00 |" in (
        repo / "docs" / "performance" / "writer.md").read_text()
    assert "<!-- figure: writer.cpu_ms_per_image -->2.00<!-- /figure -->" in (repo / "README.md").read_text()
    assert report_main.main(["--root", str(repo), "--check"]) == 0


def test_an_unknown_key_is_an_error_naming_the_page_and_line(repo: pathlib.Path, capsys):
    (repo / "docs" / "guides").mkdir(parents=True)
    (repo / "docs" / "guides" / "x.md").write_text("# X\n\n<!-- figure: writer.speed -->1<!-- /figure -->\n")
    assert report_main.main(["--root", str(repo), "--check"]) == 2
    assert "docs/guides/x.md:3: unknown figure key 'writer.speed'" in capsys.readouterr().err


def test_a_figure_without_its_results_is_an_error():
    with pytest.raises(figures.FigureError, match="no launcher results"):
        figures.rewrite("<!-- figure: launcher.seconds_2m -->19.7<!-- /figure -->",
                        figures.values({"writer": WRITER}), "README.md")


@pytest.mark.slow  # runs git for the record's commit
def test_a_benchmark_record_says_what_ran_where_and_with_which_versions(tmp_path: pathlib.Path):
    recording = Recording("reader", ["--rounds", "1", "--json", "out.json"], module="benchmarks.bench_reader")
    written = recording.write(tmp_path / "results" / "reader.json", {"results": {}})
    record = json.loads((tmp_path / "results" / "reader.json").read_text())
    assert record == written
    assert record["command"] == "python -m benchmarks.bench_reader --rounds 1 --json out.json"
    assert record["results"] == {"results": {}}
    assert len(record["machine"]["load_average_before"]) == 3 and len(record["machine"]["load_average_after"]) == 3
    assert record["machine"]["cores"] >= 1
    assert record["versions"]["python"].count(".") == 2
    assert record["versions"]["beam-prep"]  # the commit the numbers belong to
    assert record["versions"]["numpy"]
    assert render.load_results(tmp_path / "results") == {"reader": record}


def test_the_writer_table_shows_the_newer_peers_and_reads_results_made_before_them():
    from benchmarks.report import tables

    before = tables.writer(WRITER["results"])  # no (j), (k), (l), no peer_versions
    assert "Row (h) ran img2dataset 1.47.0. Rows (j), (k) and (l) are absent" in before
    results = copy.deepcopy(WRITER["results"])
    results["peers"].update(mds=_run(20000, 20.0, 40.0), litdata=_run(20000, 25.0, 64.0),
                            ray=_run(20000, 32.0, 80.0))
    results["peer_versions"] = {"img2dataset": "1.47.0", "mosaicml-streaming": "0.13.0", "litdata": "0.2.76",
                                "ray": "2.60.0"}
    after = tables.writer(results)
    # (c): 16 s, 1.60 ms an image; (j): 20 s, 2.00 ms.
    assert "| (j) MosaicML Streaming: Pool of `MDSWriter`s, `merge_index` (MDS, zstd) | 20,000 | 20.0 | 1,000.0 " \
           "| 1.25× | 2.00 | 1.25× |" in after
    assert "| (l) Ray Data: `read_binary_files`, `map`, `write_tfrecords` | 20,000 | 32.0 | 625.0 | 2.00× " \
           "| 4.00 | 2.50× |" in after
    assert ("Rows (h), (j), (k) and (l) ran img2dataset 1.47.0, mosaicml-streaming 0.13.0, litdata 0.2.76, "
            "ray 2.60.0.") in after and "absent" not in after
    values = figures.values({"writer": {**WRITER, "results": results}})
    assert values["writer.vs_litdata_cpu"] == "2.00×"
    assert figures.values({"writer": WRITER})["writer.vs_ray_cpu"].startswith("!")


def test_the_pytorch_reader_table_gives_medians_and_the_ratio_to_imagefolder():
    from benchmarks.report import tables

    readers = {"p": {"label": "(p) data_source", "images_per_s": [900.0, 1000.0, 5000.0], "cpu_s_per_1000": [2, 1, 3]},
               "i": {"label": "(i) ImageFolder", "images_per_s": [250.0, 200.0, 300.0], "cpu_s_per_1000": [4, 4, 4]}}
    table = tables.reader_pytorch({"images": 2000, "image_size": 224, "jpeg_quality": 90, "num_shards": 8,
                                   "workers": 2, "batch_size": 256, "rounds": 3, "seconds": 3.0,
                                   "readers": readers})
    assert "| (p) data_source | 1,000 | 2.00 | 4.00× |" in table
    assert "| (i) ImageFolder | 250 | 4.00 | — |" in table
    assert table.startswith("2,000 images, 224×224 JPEG q90 in 8 shards; 2 worker processes a loader")


def test_the_writer_table_holds_the_command_to_the_records_limit_where_results_have_it():
    from benchmarks.report import tables

    assert "(b″)" not in tables.writer(WRITER["results"])  # results from before the row
    results = copy.deepcopy(WRITER["results"])
    results["limit"].update(record_seconds=2.0, record_cpu_seconds=2.0, record_per_core=750.0,
                            record_images_per_s=1500.0)
    # (c): 20,000 images in 16 s, 1,250/s: 0.83× the record's limit of 1,500/s.
    assert ("| (b″) limit with the record: read, `process_image`, SHA-256, Example, GZIP framing: 750/s × 2 cores "
            "| 1,500 | 2.0 | 1,500.0 | 0.83× | 1.33 (one process) |") in tables.writer(results)
