"""``beam-prep report``'s page in a real browser: Debian's headless Chromium driven by Selenium.

The page loads from file:// with no console error and no request for anything outside it; every
number it takes from the manifest is the manifest's; each gallery picture is its record's image
(decoded from the page and compared with the record TensorFlow reads back); the leak pairs are
exactly duplicates.jsonl's; labels with markup, quotes, right-to-left text and emoji show as
written. The screenshot the docs page shows is taken here, checked not blank, and written over
docs/guides/images/report.png only with ``BEAM_PREP_UPDATE_SCREENSHOTS=1`` (CONTRIBUTING.md): a test
run leaves the checkout as it was.

Chromium missing skips these tests, but where ``.ci/run`` installs it (``BEAM_PREP_REQUIRE_CHROMIUM``,
or ``CI``) it fails them.
"""
from __future__ import annotations

import base64
import io
import itertools
import json
import os
import shutil
import urllib.parse

import numpy as np
import pytest
from helpers import REPO, make_tree, prepare_here, read_split
from PIL import Image

from beam_prep.tools.report import make_report

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
HOSTILE = ["<script>alert(1)", 'say "hi" & <b>', "שלום", "cat 🐱"]
SCREENSHOT = REPO / "docs" / "guides" / "images" / "report.png"
UPDATE_SCREENSHOTS = "BEAM_PREP_UPDATE_SCREENSHOTS"


def _need_chromium() -> None:
    if CHROMIUM and CHROMEDRIVER:
        return
    message = "Debian's chromium and chromium-driver are not installed (.ci/run installs them)"
    if os.environ.get("BEAM_PREP_REQUIRE_CHROMIUM") or os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Two splits, labels named to break a page, a copy across splits, a failure and a skipped file."""
    root = tmp_path_factory.mktemp("report")
    tree = root / "tree"
    make_tree(tree, {name: 3 for name in HOSTILE}, splits=["train", "validation"], size=(24, 20))
    shutil.copy(tree / "train" / HOSTILE[0] / "img_000.jpg", tree / "validation" / HOSTILE[1] / "copy.jpg")
    (tree / "train" / HOSTILE[2] / "broken.jpg").write_bytes(b"not a jpeg")
    (tree / "train" / HOSTILE[3] / "notes.txt").write_text("not an image")
    out = root / "records"
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "20", "--num_shards", "2")
    here = os.getcwd()
    os.chdir(root)  # the page names the folder as given ("records", as in the docs), its input below here as "tree"
    try:
        report = make_report("records")
    finally:
        os.chdir(here)
    return out, report


@pytest.fixture(scope="module")
def browser(dataset):
    _need_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1200,1600", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"):
        options.add_argument(flag)  # a request that leaves the file reaches no server
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        driver.get(pathlib_uri(dataset[0] / "report.html"))
        yield driver
    finally:
        driver.quit()


def pathlib_uri(path) -> str:
    return "file://" + urllib.parse.quote(os.path.abspath(path))


@pytest.fixture(scope="module")
def manifest(dataset):
    return json.loads((dataset[0] / "manifest.json").read_text())


def test_the_page_loads_with_no_console_error_and_no_request_outside_it(browser, dataset):
    from selenium.webdriver.common.by import By

    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("beam-prep report: ")
    assert browser.execute_script("return document.scripts.length") == 0
    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == []
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    assert urls and urls[0] == pathlib_uri(dataset[0] / "report.html")
    outside = [url for url in urls if not url.startswith(("data:", pathlib_uri(dataset[0] / "report.html")))]
    assert outside == []
    images = browser.execute_script("return Array.from(document.images).map(i => [i.src.slice(0, 5), i.complete,"
                                    " i.naturalWidth])")
    assert images and all(src == "data:" and done and width > 0 for src, done, width in images)


def resolve(manifest: dict, key: str):
    """The manifest's value at a dotted ``key`` whose parts may hold dots themselves (label names);
    ``.length`` is a list's length."""
    value, rest = manifest, key
    while rest:
        if rest == "length":
            return len(value)
        if isinstance(value, list):
            head, _, rest = rest.partition(".")
            value = value[int(head)]
            continue
        match = max((k for k in value if rest == k or rest.startswith(k + ".")), key=len)
        value, rest = value[match], rest[len(match) + 1:]
    return value


def test_every_count_on_the_page_is_the_manifests(browser, manifest):
    from selenium.webdriver.common.by import By

    shown = {}
    for element in browser.find_elements(By.CSS_SELECTOR, "[data-manifest]"):
        key = element.get_attribute("data-manifest")
        assert element.text == f"{resolve(manifest, key):,}", key
        shown[key] = element.text
    expected = {f"splits.{split}.num_examples" for split in manifest["splits"]}
    expected |= {f"splits.{split}.class_counts.{label}" for split, s in manifest["splits"].items()
                 for label in s["class_counts"]}
    expected |= {f"counts.{k}" for k in manifest["counts"]} | {"duplicates.across_splits", "labels.length"}
    expected |= {f"skipped_by_reason.{r}" for r in manifest["skipped_by_reason"]}
    expected |= {"sources.images", "sources.cropped", "sources.upscaled"}
    expected |= {f"sources.{h}.{b}" for h in ("width", "height", "aspect") for b in manifest["sources"][h]}
    assert expected <= set(shown)
    assert manifest["sources"]["images"] == manifest["counts"]["written"]
    assert manifest["counts"]["failed"] == 1 and manifest["duplicates"]["across_splits"] == 1


def test_each_gallery_picture_is_its_records_image(browser, dataset, manifest):
    import tensorflow as tf
    from selenium.webdriver.common.by import By

    records = {r["image/filename"].decode(): r for r in read_split(dataset[0], "train")}
    figures = browser.find_elements(By.CSS_SELECTOR, "figure[data-gallery]")
    per_row = {}
    for figure in figures:
        name = figure.get_attribute("data-filename")
        row = int(figure.get_attribute("data-gallery"))
        record = records[name]
        assert record["image/class/text"].decode() == manifest["labels"][row]
        assert figure.find_element(By.TAG_NAME, "figcaption").text == name
        img = figure.find_element(By.TAG_NAME, "img")
        assert img.get_attribute("alt") == name
        src = img.get_attribute("src")
        assert src.startswith("data:image/png;base64,")  # 20x20 fits a thumbnail: pixel for pixel, lossless
        shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB"))
        stored = tf.io.decode_jpeg(record["image/encoded"], channels=3, dct_method="INTEGER_ACCURATE").numpy()
        assert shown.shape == stored.shape
        assert np.abs(shown.astype(int) - stored.astype(int)).max() <= 2  # one JPEG decoder against another
        per_row[row] = per_row.get(row, 0) + 1
    train = manifest["splits"]["train"]["class_counts"]
    assert per_row == {i: min(6, train[label]) for i, label in enumerate(manifest["labels"]) if train[label]}


def test_the_leak_pairs_shown_are_exactly_duplicates_jsonls(browser, dataset):
    from selenium.webdriver.common.by import By

    groups = {}
    for line in (dataset[0] / "duplicates.jsonl").read_text().splitlines():
        row = json.loads(line)
        groups.setdefault((row["kind"], row.get("group", row["sha256"])), []).append((row["split"], row["path"]))
    expected = {frozenset((a, b)) for files in groups.values() for a, b in itertools.combinations(files, 2)
                if a[0] != b[0]}
    table = browser.find_element(By.CSS_SELECTOR, "table[data-table=pairs]")
    shown = set()
    for tr in table.find_elements(By.TAG_NAME, "tr")[1:]:
        files = tr.find_elements(By.CSS_SELECTOR, "figure[data-file]")
        shown.add(frozenset((f.get_attribute("data-split"), f.get_attribute("data-file")) for f in files))
        assert all(f.find_element(By.TAG_NAME, "img").get_attribute("src").startswith("data:image/") for f in files)
    assert shown == expected and len(expected) == 1
    assert browser.find_element(By.CSS_SELECTOR, "[data-pairs]").text == "1"


def test_labels_with_markup_quotes_rtl_and_emoji_show_as_written(browser, manifest):
    from selenium.webdriver.common.by import By

    assert sorted(manifest["labels"]) == sorted(HOSTILE)
    heads = [h.find_element(By.TAG_NAME, "bdi").text for h in browser.find_elements(By.CSS_SELECTOR, "[data-gallery-row]")]
    assert heads == manifest["labels"]
    cells = [tr.find_elements(By.TAG_NAME, "td")[1].text
             for tr in browser.find_elements(By.CSS_SELECTOR, "table[data-table=classes] tr")[1:]]
    assert sorted(cells) == sorted(HOSTILE)
    assert browser.execute_script("return document.querySelectorAll('b, script').length") == 0


def test_the_screenshot_of_the_docs_page_is_taken_and_not_blank(browser, dataset):
    shot = browser.get_screenshot_as_png()
    pixels = np.asarray(Image.open(io.BytesIO(shot)).convert("L"), dtype=float)
    assert pixels.shape[0] > 500 and pixels.std() > 10  # text, bars and pictures, not one colour
    overview = browser.find_element("css selector", "#overview + table").text
    assert "from tree" in overview and str(dataset[0].parent) not in overview  # the input below the cwd, relative
    taken = dataset[0].parent / "report.png"
    Image.open(io.BytesIO(shot)).save(taken, optimize=True)
    if os.environ.get(UPDATE_SCREENSHOTS) == "1":  # the picture docs/guides/inspect-verify-bench.md shows
        shutil.copyfile(taken, SCREENSHOT)


def test_names_that_reorder_text_or_run_long_stay_in_their_place_and_the_page_width(browser, dataset, tmp_path):
    """A right-to-left override in a file name or a message reorders nothing after it (each such string is
    isolated), and names of 255 characters with no space wrap inside the window."""
    copy = shutil.copytree(dataset[0], tmp_path / "records")
    (copy / "report.html").unlink()
    long = "N" * 255
    rows = [{"path": f"/in/\u202egpj.exe{i}", "relpath": "x", "stage": "decode", "error_type": "OSError" + long,
             "message": f"\u202ebad {long}"} for i in range(2)]
    (copy / "errors.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (copy / "skipped.jsonl").write_text(json.dumps({"path": "/in/n", "relpath": "\u202e" + long,
                                                    "reason": "not an image file"}) + "\n")
    make_report(str(copy))
    try:
        browser.get(pathlib_uri(copy / "report.html"))
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        placed = browser.execute_script("""
            const found = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
            for (let n; (n = walker.nextNode());) {
              const e = n.parentElement;
              if (/[\\u202a-\\u202e\\u2066-\\u2069]/.test(n.data) && !(e instanceof SVGElement))
                found.push([e.tagName, getComputedStyle(e).unicodeBidi]);
            }
            return found;""")
        assert len(placed) >= 5 and all(bidi == "isolate" for _, bidi in placed), placed
    finally:
        browser.get(pathlib_uri(dataset[0] / "report.html"))
