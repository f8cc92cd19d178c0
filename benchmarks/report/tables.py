"""Markdown tables from the ``results`` of each benchmark's ``--json`` file, one function per benchmark.

Each function takes the ``results`` object a benchmark wrote (see
``benchmarks/results.py``) and returns markdown: the tables the benchmark's
page shows. Nothing here imports Beam, TensorFlow or Pillow.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

from benchmarks import PEERS_INSTALL

GIB = 2**30
MIB = 2**20

WRITER_PEERS = {
    "handwritten": "(g) hand-written Pool + Pillow + TFRecordWriter",
    "img2dataset": "(h) img2dataset (file:// list, center_crop)",
    "mds": "(j) MosaicML Streaming: Pool of `MDSWriter`s, `merge_index` (MDS, zstd)",
    "litdata": "(k) LitData `optimize` (chunks, zstd asked)",
    "ray": "(l) Ray Data: `read_binary_files`, `map`, `write_tfrecords`",
    "accelerated": "(c′) beam-prep with the opt-in pillow-simd",
    "pillow_path": "(c″) beam-prep with every JPEG down Pillow's path (`BEAM_PREP_JPEG_PATH=pillow`)",
}
# Rows that are beam-prep's own command run another way, not peers it is compared with.
OURS_VARIANTS = ("accelerated", "pillow_path")
# The peers a run has only where their tools are installed, by the distribution whose version it records;
# results from before (j) to (l) existed have none of them, nor ``peer_versions``.
OPTIONAL_PEERS = {"img2dataset": "img2dataset", "mds": "mosaicml-streaming", "litdata": "litdata", "ray": "ray"}
SEED = "(a) seed notebook writer (tf.data, GZIP)"
OURS = "(c) beam-prep `pipelines.prepare_images`"
# The work no writer of these records can skip, one process's rate × cores (``benchmarks.limit``).
RECORD_LIMIT = ("(b″) limit with the record: read, `process_image`, SHA-256, Example, GZIP framing: "
                "{per_core:,.0f}/s × {cores} cores")


def fmt(value: float | None, digits: int = 1) -> str:
    """``1,234.5`` (``digits`` decimals, thousands separated), or ``—`` for None."""
    return "—" if value is None else f"{value:,.{digits}f}"


def times(ratio: float | None, digits: int = 2) -> str:
    """``1.23×``, or ``—`` for None."""
    return "—" if ratio is None else f"{ratio:.{digits}f}×"


# --- writer -----------------------------------------------------------------------------------

def images_per_s(run: Mapping) -> float | None:
    """A writer run's images per second of wall time; None for a failed run."""
    return None if run.get("error") or not run["seconds"] else run["images"] / run["seconds"]


def cpu_ms_per_image(run: Mapping) -> float | None:
    """A writer run's CPU (its whole process tree's) per image, in ms; None for a failed run."""
    return None if run.get("error") or not run.get("cpu_seconds") else run["cpu_seconds"] / run["images"] * 1e3


def median_run(runs: Sequence[Mapping]) -> Mapping:
    """The run with the median time (the first if none succeeded), as ``bench_writer`` picks it."""
    ok = sorted((r for r in runs if not r.get("error")), key=lambda r: r["seconds"])
    return ok[len(ok) // 2] if ok else runs[0]


def _writer_row(name: str, run: Mapping, ours: Mapping | None) -> str:
    rate = images_per_s(run)
    ratio = "—" if ours is None or rate is None or images_per_s(ours) is None else times(images_per_s(ours) / rate)
    cpu_ratio = "—"
    if ours is not None and cpu_ms_per_image(run) and cpu_ms_per_image(ours):
        cpu_ratio = times(cpu_ms_per_image(run) / cpu_ms_per_image(ours))
    return (f"| {name} | {run['images']:,} | {fmt(run['seconds'])} | {'failed' if run.get('error') else fmt(rate)} "
            f"| {ratio} | {fmt(cpu_ms_per_image(run), 2)} | {cpu_ratio} | {fmt(run.get('psnr'), 2)} "
            f"| {fmt(run['peak_rss_bytes'] / GIB, 2)} | {fmt(run['output_bytes'] / 1e6)} |")


def writer(results: Mapping) -> str:
    """The main table ((a), the peers, (b), (b′), (c)), (c′)'s ratios and the originals table."""
    runs = sorted(results["runs"], key=lambda r: r["images"])
    largest = runs[-1]["ours"]
    limit = results["limit"]
    lines = ["| run | images | wall s | images/s | (c) ÷ row | CPU ms per image | (c) ÷ row per CPU-s "
             "| PSNR dB | peak RSS GiB | output MB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [_writer_row(SEED, size["seed"], size["ours"]) for size in runs]
    for name, run in results["peers"].items():
        lines.append(_writer_row(WRITER_PEERS.get(name, name), run, largest))
    kernel_ms = limit["serial_cpu_seconds"] / limit["sample"] * 1e3
    for label, rate, seconds in (
            (f"(b) limit: `process_image` {limit['per_core']:,.0f}/s × {limit['cores']} cores",
             limit["images_per_s"], limit["serial_seconds"]),
            (f"(b′) limit measured: {limit['cores']} processes at once", limit["parallel_images_per_s"],
             limit["parallel_seconds"])):
        ours_rate = images_per_s(largest)
        lines.append(f"| {label} | {limit['sample']:,} | {fmt(seconds)} | {fmt(rate)} "
                     f"| {times(ours_rate / rate) if ours_rate else '—'} | {kernel_ms:.2f} (kernel alone) "
                     "| — | — | — | — |")
    if "record_seconds" in limit:  # results from before the row have none
        rate = limit["record_images_per_s"]
        lines.append(f"| {RECORD_LIMIT.format(per_core=limit['record_per_core'], cores=limit['cores'])} "
                     f"| {limit['sample']:,} | {fmt(limit['record_seconds'])} | {fmt(rate)} "
                     f"| {times(ours_rate / rate) if ours_rate else '—'} "
                     f"| {limit['record_cpu_seconds'] / limit['sample'] * 1e3:.2f} (one process) | — | — | — | — |")
    lines += [_writer_row(OURS, size["ours"], None) for size in runs]
    out = ["\n".join(lines)]
    out.append(_peer_note(results))
    fast = results["peers"].get("accelerated")
    if fast and not fast.get("error") and cpu_ms_per_image(fast):
        against = [("(c)", largest), ("(a) the seed writer", runs[-1]["seed"]),
                   *((WRITER_PEERS[name], run) for name, run in results["peers"].items()
                     if name in WRITER_PEERS and name not in OURS_VARIANTS)]
        ratios = ", ".join(f"{times(cpu_ms_per_image(run) / cpu_ms_per_image(fast))} {name}"
                           for name, run in against if cpu_ms_per_image(run))
        library = fast.get("details", {}).get("imaging_library")
        out.append(f"(c′) with {library or 'pillow-simd'}, images per CPU-second: {ratios}.")
    if results.get("rounds"):
        out.append(writer_rounds(results["rounds"]))
    if results.get("originals"):
        out.append("Originals beside (c), each run right after it in a round; ÷ (c) is the median of the "
                   "rounds' ratios, CPU the whole process tree's:")
        out.append(originals(results))
    loads = results.get("load_average") or []
    if loads:
        out.append(f"Load average (1 min) after each run from (c) on: {min(loads):.1f} to {max(loads):.1f}.")
    return "\n\n".join(out)


def writer_rounds(rounds: Mapping[str, Sequence[Mapping]]) -> str:
    """(c) per CPU-second over (a) and each peer, round by round, the worse first: the issue's targets are
    the worse round's."""
    ours = rounds["ours"]
    parts = []
    for name, runs in rounds.items():
        if name == "ours" or name in OURS_VARIANTS:
            continue
        ratios = sorted(run["cpu_seconds"] / mine["cpu_seconds"] for mine, run in zip(ours, runs)
                        if run["cpu_seconds"] and mine["cpu_seconds"])
        label = SEED if name == "seed" else WRITER_PEERS.get(name, name)
        parts.append(f"{label.split(' ', 1)[0]} {', '.join(times(r) for r in ratios) or 'failed'}")
    return ("(c) ÷ each row per CPU-second, each round's (the worse first; (c) the mean of its round's two runs): "
            + "; ".join(parts) + ".")


def _peer_note(results: Mapping) -> str:
    """Which tool versions the optional peer rows ran, and which rows are absent and why."""
    found = results.get("peer_versions") or {"img2dataset": results.get("img2dataset")}
    ran = [key for key in OPTIONAL_PEERS if key in results["peers"]]
    absent = [key for key in OPTIONAL_PEERS if key not in results["peers"]]
    notes = []
    if ran:
        versions = ", ".join(f"{OPTIONAL_PEERS[key]} {found.get(OPTIONAL_PEERS[key]) or '(version unknown)'}"
                             for key in ran)
        notes.append(f"{_rows(ran)} ran {versions}.")
    if absent:
        notes.append(f"{_rows(absent)} {'is' if len(absent) == 1 else 'are'} absent: not installed where this "
                     f"ran, or newer than these results (`{PEERS_INSTALL}` makes the peers' virtualenv; "
                     "Ray Data is in the `test` extra).")
    return " ".join(notes)


def _rows(keys: Sequence[str]) -> str:
    """``Row (h)``, ``Rows (j) and (k)``, ``Rows (h), (j) and (k)``."""
    letters = [WRITER_PEERS[key].split(" ", 1)[0] for key in keys]
    if len(letters) == 1:
        return f"Row {letters[0]}"
    return f"Rows {', '.join(letters[:-1])} and {letters[-1]}"


def originals(results: Mapping) -> str:
    """(c) and the originals runs (d) to (f), by corpus size."""
    lines = ["| run | images | wall s | images/s | ÷ (c) | images per CPU-s | ÷ (c) per CPU-s | peak RSS GiB "
             "| output MB | kept, re-encoded |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for size in sorted(results["runs"], key=lambda r: r["images"]):
        rows = [("(c) beam-prep default: 224×224 centre crops, JPEG q90", size["ours"], None, None)]
        rows += [(o["name"], median_run(o["runs"]), o["ratio_to_ours"], o["ratio_to_ours_per_cpu"])
                 for o in results["originals"] if o["images"] == size["images"]]
        for name, run, ratio, cpu_ratio in rows:
            counts = run.get("details", {}).get("originals")
            kept = f"{counts['kept']:,}, {counts['reencoded']:,}" if counts else "—"
            per_cpu = None if not cpu_ms_per_image(run) else 1e3 / cpu_ms_per_image(run)
            lines.append(f"| {name} | {run['images']:,} | {fmt(run['seconds'])} "
                         f"| {'failed' if run.get('error') else fmt(images_per_s(run))} | {times(ratio)} "
                         f"| {fmt(per_cpu)} | {times(cpu_ratio)} | {fmt(run['peak_rss_bytes'] / GIB, 2)} "
                         f"| {fmt(run['output_bytes'] / 1e6)} | {kept} |")
    return "\n".join(lines)


def writer_formats(results: Mapping) -> str:
    """Each ``--file_format``'s run, the reads beside them and the ArrayRecord options."""
    base = "tfrecord-none"
    lines = ["| run | images | wall s | images/s | ÷ tfrecord none | CPU ms per image | ÷ tfrecord none per CPU-s "
             "| output MB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label in results["labels"].items():
        run = median_run(results["runs"][key])
        ratios = ["—" if key == base else times(ratio_map[key], 3)
                  for ratio_map in (results["ratio_to_tfrecord_none"], results["ratio_to_tfrecord_none_per_cpu"])]
        lines.append(f"| {label} | {run['images']:,} | {fmt(run['seconds'])} "
                     f"| {'failed' if run.get('error') else fmt(images_per_s(run))} | {ratios[0]} "
                     f"| {fmt(cpu_ms_per_image(run), 2)} | {ratios[1]} | {fmt(run['output_bytes'] / 1e6)} |")
    out = ["\n".join(lines)]
    reads = results.get("reads_per_second") or {}
    if reads:
        out.append("Reading the runs' output in one process (batches of 256):\n\n"
                   + "\n".join(f"- {name}: {rate:,.0f} images/s" for name, rate in reads.items()))
    options = results.get("array_record_options") or {}
    if options:
        kinds = list(options)
        header = " | ".join(f"{kind}: size ÷ payload | {kind}: random lookup µs" for kind in kinds)
        lines = [f"| options | {header} |", "|---|" + "---:|---:|" * len(kinds)]
        for i, row in enumerate(options[kinds[0]]):
            cells = " | ".join(f"{options[kind][i]['size_over_payload']:.4f} | {options[kind][i]['lookup_us']:,.1f}"
                               for kind in kinds)
            lines.append(f"| `{row['options']}` | {cells} |")
        out.append("ArrayRecord writer options, on the uncompressed TFRecord run's records (JPEG) and the same "
                   "images as raw pixels:\n\n" + "\n".join(lines))
    return "\n\n".join(out)


def writer_gcs(results: Mapping) -> str:
    """Local disk against gs:// at each added latency, for each sink; with the command's own CPU
    per image (results that have it), which the test server sharing the cores does not move."""
    runs = results["runs"]
    sinks = ("streaming", "shuffle")
    with_cpu = any(r.get("command_ms_per_image") for r in runs)

    def key(r: Mapping) -> tuple:
        return r["sink"], r["source"], r["latency_ms"], r["images"], r.get("concurrency") or 0

    by_key = {key(r): r for r in runs}
    cpu_head = " command CPU ms/image | ÷ local disk per CPU-s |" if with_cpu else ""
    lines = ["| sink | input | added latency | reads in flight | images | wall s | images/s | ÷ same at 0 ms "
             f"| ÷ local disk | peak RSS GiB | server CPU ms/image |{cpu_head}",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if with_cpu else "")]
    for r in sorted(runs, key=lambda r: (sinks.index(r["sink"]) if r["sink"] in sinks else 9, r["images"],
                                         r["source"] != "local", r["latency_ms"], r.get("concurrency") or 0)):
        zero = by_key.get((r["sink"], "gs", 0, r["images"], 0))
        local = by_key.get((r["sink"], "local", 0, r["images"], 0))

        def ratio(base: Mapping | None, r: Mapping = r) -> str:
            if r["source"] == "local" or not base or not base.get("images_per_s") or not r.get("images_per_s"):
                return "—"
            return times(r["images_per_s"] / base["images_per_s"])

        server = r.get("server_ms_per_image")
        cpu_cells = ""
        if with_cpu:
            own, base = r.get("command_ms_per_image"), (local or {}).get("command_ms_per_image")
            per_cpu = "—" if r["source"] == "local" or not own or not base else times(base / own)
            cpu_cells = f" {'—' if not own else f'{own:.2f}'} | {per_cpu} |"
        lines.append(
            f"| {r['sink']} | {'gs://' if r['source'] == 'gs' else 'local disk'} "
            f"| {'—' if r['source'] == 'local' else str(r['latency_ms']) + ' ms'} "
            f"| {r.get('concurrency') or 'default'} | {r['images']:,} | {r['seconds']:.1f} "
            f"| {'failed' if r.get('error') else fmt(r['images_per_s'])} | {ratio(zero)} | {ratio(local)} "
            f"| {r['peak_rss_bytes'] / GIB:.2f} | {'—' if server is None else f'{server:.2f}'} |{cpu_cells}")
    return "\n".join(lines)


def gcs_read(results: Mapping) -> str:
    """Per object read from the test GCS server, by client."""
    lines = [f"One thread reading {results['objects']:,} objects of {results['object_bytes'] // 1000} KB, per object:",
             "", "| client | wall ms | client CPU ms | requests | emulator CPU ms |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['client']} | {r['wall_ms']:.2f} | {r['cpu_ms']:.2f} | {r['requests']:.1f} "
              f"| {r['emulator_cpu_ms']:.2f} |" for r in results["rows"]]
    if results.get("shards"):
        lines += ["", f"(d) and (e) read on {results['read_concurrency']} threads, through the read-ahead window, "
                      f"with {results['latency_ms']:g} ms added to every request."]
    return "\n".join(lines)


def gcs_clients(results: Mapping) -> str:
    """Each gs:// client's CPU per object (and over the floor's: local files, the same work) and throughput,
    with its ratios to the baseline's in the same rounds."""
    lines = [f"{results['objects']:,} objects of {results['min_bytes'] // 1000}-{results['max_bytes'] // 1000} KB, "
             f"{results['concurrency']} reads in flight{', over TLS' if results.get('tls') else ''}; the caller "
             f"works on each object (an empty loop of {results['python_loops']:,} with the GIL, SHA-256 of "
             f"{results['released_kb']:,} KB without). Medians of {results['rounds']} interleaved rounds; each "
             f"ratio is taken within a round against {results['baseline']}, worst: the round least in the "
             "row's favour.", "",
             "| client | added latency | CPU µs per object | of it system | over the floor, µs | × baseline's over the floor (median, worst) "
             "| objects/s | × baseline's rate (median, worst) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['client']} | {r['latency_ms']:g} ms | {r['cpu_us_per_object']:,.0f} | {r['system_us_per_object']:,.0f} | {r['over_floor_us']:,.0f} "
              f"| {r['over_floor_vs_baseline_median']:.2f}, {r['over_floor_vs_baseline_worst']:.2f} "
              f"| {r['objects_per_s']:,.0f} | {r['rate_vs_baseline_median']:.2f}, "
              f"{r['rate_vs_baseline_worst']:.2f} |" for r in results["rows"]]
    return "\n".join(lines)


def listing(results: Mapping) -> str:
    """Each lister at each added latency, on one gs:// tree."""
    lines = [f"{results['objects']:,} objects in {results['labels']:,} label folders, a fresh process each, "
             "after its imports:", "",
             "| lister | added latency | seconds | lister CPU s | lister peak RSS MB | requests | emulator CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['lister']} | {r['latency_ms']} ms | {r['seconds']:.2f} | {r['cpu_s']:.2f} "
              f"| {r['peak_rss_mb']:.0f} | {r['requests']:,} | {r['emulator_cpu_s']:.2f} |"
              for r in sorted(results["rows"], key=lambda r: (r["latency_ms"], r["lister"]))]
    return "\n".join(lines)


# --- the others -------------------------------------------------------------------------------

def resize(results: Mapping) -> str:
    """Each candidate's time and quality on each set."""
    lines = ["| candidate | set | µs per image | × pillow | PSNR median dB | 10th pct dB | min dB "
             "| mean − pillow's dB | quality kept |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in results["rows"]:
        lines.append(f"| {row['candidate']} | {row['set']} ({row['images']}) | {row['seconds'] * 1e6:,.0f} "
                     f"| {row['vs_pillow']:.2f}× | {row['psnr_median']:.2f} | {row['psnr_10th']:.2f} "
                     f"| {row['psnr_min']:.2f} | {row['psnr_mean_vs_pillow']:+.2f} "
                     f"| {'yes' if row['quality_kept'] else 'no'} |")
    out = ["\n".join(lines)]
    if results.get("not_installed"):
        out.append(f"Not installed where this ran, so absent: {', '.join(results['not_installed'])}.")
    return "\n\n".join(out)


def launcher_medians(results: Mapping) -> dict[tuple[str, int], dict[str, float]]:
    """Each (run, files)'s median seconds, process seconds and peak RSS over the repeats."""
    medians = {}
    for key in {(r["run"], r["files"]) for r in results["runs"]}:
        same = [r for r in results["runs"] if (r["run"], r["files"]) == key]
        medians[key] = {field: statistics.median(r[field] for r in same)
                        for field in ("seconds", "process_seconds", "peak_rss_bytes")}
    return medians


def launcher(results: Mapping) -> str:
    """Each run at each tree size, against the bare walk (a)."""
    medians = launcher_medians(results)
    sizes = sorted({files for _, files in medians})
    names = sorted({run for run, _ in medians})
    walk = next(name for name in names if name.startswith("(a)"))
    lines = ["| files | run | seconds | process s | peak RSS MB | seconds ÷ (a) | peak RSS ÷ smallest tree's |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for files in sizes:
        for run in names:
            m = medians[run, files]
            first = medians[run, sizes[0]]
            lines.append(f"| {files:,} | {run} | {m['seconds']:.1f} | {m['process_seconds']:.1f} "
                         f"| {m['peak_rss_bytes'] / MIB:.0f} | {m['seconds'] / medians[walk, files]['seconds']:.2f} "
                         f"| {m['peak_rss_bytes'] / first['peak_rss_bytes']:.2f} |")
    return "\n".join(lines)


def launcher_append(results: Mapping) -> str:
    """An append's launcher (h) against the listing of as many files (b): peaks in its own process, medians."""
    runs = results["runs"]
    keys = sorted({(r["files"], r["run"]) for r in runs})
    medians = {key: {field: statistics.median(r[field] for r in runs if (r["files"], r["run"]) == key)
                     for field in ("process_seconds", "peak_rss_bytes", "peak_pss_bytes", "peak_uss_bytes")}
               for key in keys}
    lines = ["| files or records | run | process s | peak RSS MB | peak PSS MB | peak USS MB "
             "| PSS ÷ listing's | USS ÷ listing's |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for files, run in keys:
        m = medians[files, run]
        base = next(medians[key] for key in keys if key[0] == files and key[1].startswith("(b)"))
        lines.append(f"| {files:,} | {run} | {m['process_seconds']:.1f} | {m['peak_rss_bytes'] / MIB:.0f} "
                     f"| {m['peak_pss_bytes'] / MIB:.0f} | {m['peak_uss_bytes'] / MIB:.0f} "
                     f"| {m['peak_pss_bytes'] / base['peak_pss_bytes']:.2f} "
                     f"| {m['peak_uss_bytes'] / base['peak_uss_bytes']:.2f} |")
    return "\n".join(lines)


def duplicates(results: Mapping) -> str:
    """Each search at each size and share of copies, against the dict baseline (a)."""
    rows = results["runs"]
    by = {(r["search"], r["records"], r["share"]): r for r in rows}
    searches = results["searches"]
    sizes = sorted({r["records"] for r in rows})
    shares = sorted({r["share"] for r in rows})
    lines = ["| records | with a copy | search | seconds | memory MB | bytes / record "
             "| growth / record from the smallest size | seconds ÷ (a) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for share in shares:
        for records in sizes:
            for search in searches:
                r = by[search, records, share]
                base = by[searches[0], records, share]
                low = by[search, sizes[0], share]
                growth = (f"{(r['grown_bytes'] - low['grown_bytes']) / (records - sizes[0]):.1f}"
                          if records > sizes[0] else "—")
                lines.append(f"| {records:,} | {share:.0%} | {search} | {r['seconds']:.1f} "
                             f"| {r['grown_bytes'] / MIB:.0f} | {r['grown_bytes'] / records:.1f} | {growth} "
                             f"| {r['seconds'] / base['seconds']:.2f} |")
    return "\n".join(lines)


def near_duplicates(results: Mapping) -> str:
    """Recall per transformation and false pairs per million unrelated pairs, at each threshold; then
    recall on the photographs alone and false pairs by what the two pictures are, at even thresholds."""
    transforms = results["transforms"]
    lines = ["| distance ≤ | " + " | ".join(f"recall: {t}" for t in transforms) + " | false pairs | per million pairs |",
             "|---:|" + "---:|" * (len(transforms) + 2)]
    for i, k in enumerate(results["thresholds"]):
        recall = " | ".join(f"{results['recall'][t][i]:.1%}" for t in transforms)
        false = results["false_pairs"][i]
        lines.append(f"| {k} | {recall} | {false:,} | {false / results['unrelated_pairs'] * 1e6:.2f} |")
    text = (f"{results['pictures']:,} pictures ({results['flat_left_out']} of one flat colour left out), "
            f"each with {len(transforms)} copies; "
            f"{results['unrelated_pairs']:,} pairs of images of different pictures.\n\n" + "\n".join(lines))
    if "pair_kinds" not in results:
        return text
    kinds, pairs = results["pair_kinds"], results["pairs_by_kind"]
    lines = ["| distance ≤ | " + " | ".join(f"photographs: {t}" for t in transforms[:3]) + " | "
             + " | ".join(f"false per million: {kind} ({n:,} pairs)" for kind, n in zip(kinds, pairs)) + " |",
             "|---:|" + "---:|" * (3 + len(kinds))]
    for i, k in enumerate(results["thresholds"]):
        if k % 2:
            continue
        recall = " | ".join(f"{results['recall_photographs'][t][i]:.1%}" for t in transforms[:3])
        false = " | ".join(f"{results['false_pairs_by_kind'][j][i] / n * 1e6:.1f}" for j, n in enumerate(pairs))
        lines.append(f"| {k} | {recall} | {false} |")
    return (text + "\n\nThe same, the photographs and their tiles apart from the faces (recall), and the false "
            "pairs by what the two pictures are:\n\n" + "\n".join(lines))


def near_search(results: Mapping) -> str:
    """Each count of hashes and threshold: seconds, CPU seconds, memory added, and the plan."""
    lines = ["| hashes | distance ≤ | bands, agreeing | seconds | CPU seconds | memory MB | bytes / hash |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["runs"]:
        lines.append(f"| {r['hashes']:,} | {r['distance']} | {r['bands']}, {r['key_bands']} | {r['seconds']:.1f} "
                     f"| {r['cpu_seconds']:.1f} | {r['grown_bytes'] / MIB:.0f} | {r['grown_bytes'] / r['hashes']:.1f} |")
    return "\n".join(lines)


def reader_rate(results: Mapping, key: str) -> tuple[float, float]:
    """A reader's median images/s and images per CPU-second over the rounds."""
    r = results["results"][key]
    return statistics.median(r["images_per_s"]), statistics.median(r["images_per_cpu_s"])


def reader(results: Mapping) -> str:
    """Each reader against the decode limit (c) and the seed notebook's reader (b); then, where the
    record has them, reader (a) on the default command's dataset and beside DALI's CPU pipeline."""
    compare = {"a": "c", "a_fast": "c_fast", "a_eval": "c", "a_crop": "c", "e": "e_limit"}
    keys = results["results"]
    lines = ["| reader | images/s | images per CPU-s | ÷ (c) limit | ÷ (b) seed |", "|---|---:|---:|---:|---:|"]

    def vs(key: str, other: str | None) -> str:
        if other is None or other not in keys or key == other:
            return "—"
        (wall, cpu), (owall, ocpu) = reader_rate(results, key), reader_rate(results, other)
        return f"{times(wall / owall)} ({times(cpu / ocpu)} per CPU-s)"

    for key, r in keys.items():
        wall, cpu = reader_rate(results, key)
        lines.append(f"| {r['label']} | {wall:,.0f} | {cpu:,.0f} | {vs(key, compare.get(key))} "
                     f"| {vs(key, 'b')} |")
    settings = results.get("settings", {})
    head = ""
    if settings:
        head = (f"{settings['images']:,} records of {settings['image_size']}×{settings['image_size']} JPEG "
                f"q{settings['jpeg_quality']} in {settings['num_shards']} GZIP shards, batch "
                f"{settings['batch_size']}; medians of {settings['rounds']} rounds of {settings['seconds']:g} s.\n\n")
    return head + "\n".join(lines) + _reader_default(results) + _reader_dali(results)


def _reader_default(results: Mapping) -> str:
    """Reader (a) on the default command's dataset against the decode limit on its records: empty
    in a record without them."""
    keys = results["results"]
    if not {"e", "e_limit"} <= keys.keys():
        return ""
    (wall, cpu), (lwall, lcpu) = reader_rate(results, "e"), reader_rate(results, "e_limit")
    shards = results.get("settings", {}).get("default_num_shards")
    layout = f" ({shards} GZIP shards)" if shards else ""
    return (f"\n\nOn the dataset the default command writes{layout}, reader (a) reads at "
            f"{times(wall / lwall)} of the decode limit on its records ({times(cpu / lcpu)} per CPU-s).")


def _reader_dali(results: Mapping) -> str:
    """beam-prep's reader beside DALI's CPU pipeline on the same uncompressed records, decode only and
    decode + resize: empty in a record without DALI's readers."""
    keys = results["results"]
    pairs = [("decode", "a_none", "x"), ("decode + resize", "a_resize", "x_resize")]
    pairs = [p for p in pairs if {p[1], p[2]} <= keys.keys()]
    if not pairs:
        return ""
    size = results.get("settings", {}).get("resize")
    lines = ["| | make_dataset images/s | DALI CPU images/s | make_dataset CPU ms / image "
             "| DALI CPU ms / image | make_dataset ÷ DALI per CPU-s |", "|---|---:|---:|---:|---:|---:|"]
    for name, ours, dali in pairs:
        (wall, cpu), (dwall, dcpu) = reader_rate(results, ours), reader_rate(results, dali)
        what = f"{name} to {size}×{size}" if name != "decode" and size else name
        lines.append(f"| {what} | {wall:,.0f} | {dwall:,.0f} | {1e3 / cpu:.2f} | {1e3 / dcpu:.2f} "
                     f"| {times(cpu / dcpu)} |")
    return ("\n\nbeam-prep's reader (training defaults) beside NVIDIA DALI's CPU pipeline "
            "(`fn.decoders.image(device=\"cpu\")`, `fn.resize`), on the same records written with "
            "`--compression none`:\n\n" + "\n".join(lines))


def verify(results: Mapping) -> str:
    """The reader's figures and ``verify``'s, against the one-pass reader (e) and the training reader (a)."""
    runs = results["runs"]
    medians = {name: (statistics.median(r["images_per_s"]), statistics.median(r["images_per_cpu_s"]))
               for name, r in runs.items()}
    names = list(medians)
    first = medians[names[0]]
    one_pass = next((medians[n] for n in names if n.startswith("(e)")), None)
    lines = ["| run | images/s | images per CPU-s | ÷ (e) | ÷ (e) per CPU-s | ÷ (a) per CPU-s |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, (wall, cpu) in medians.items():
        is_e = name.startswith("(e)") or one_pass is None
        lines.append(f"| {name} | {wall:,.0f} | {cpu:,.0f} | {'—' if is_e else times(wall / one_pass[0])} "
                     f"| {'—' if is_e else times(cpu / one_pass[1])} "
                     f"| {'—' if name == names[0] else times(cpu / first[1])} |")
    s = results.get("settings", {})
    head = ""
    if s:
        head = (f"{s['shards']} GZIP shards of {s['shard_records']:,} records ({s['images']:,} records repeated), "
                f"batch {s['batch_size']}; medians of {s['rounds']} rounds; the reader's figures after a "
                f"second's warm-up, over {s['seconds']:g} s.\n\n")
    return head + "\n".join(lines)


def startup(results: Mapping) -> str:
    """Each start-up measure's median, min and max, and the command's cost over the run without the kernel."""
    seconds = results["seconds"]
    base_values = seconds.get("command, without the kernel")
    base = statistics.median(base_values) if base_values else None
    lines = ["| measure | median | min | max | − without the kernel |", "|---|---:|---:|---:|---:|"]
    for name, values in seconds.items():
        median = statistics.median(values)
        digits = 1 if "MB" in name else 2
        extra = f"{median - base:+.2f}" if name.startswith("command") and base is not None else ""
        lines.append(f"| {name} | {median:.{digits}f} | {min(values):.{digits}f} | {max(values):.{digits}f} "
                     f"| {extra} |")
    return (f"Kernel: {results['kernel']}; {results['rounds']} rounds, alternating.\n\n" + "\n".join(lines)
            + (f"\n\n{startup_phases(results)}" if results.get("phases") else ""))


def startup_phases(results: Mapping) -> str:
    """The command's fixed cost on each tree, medians, workers started with it against by Beam."""
    keys = ("start-up s", "finishing s", "fixed s", "before the run s", "wall s", "CPU s", "CPU ÷ (cores × wall)")
    lines = ["| tree | workers | " + " | ".join(k.replace(" s", " (s)") for k in keys) + " |",
             "|---|---|" + "---:|" * len(keys)]
    for tree, runs in results["phases"].items():
        for name, figures in runs.items():
            cells = [f"{statistics.median(figures[k]):.2f}" for k in keys]
            lines.append(f"| {tree} | {name} | " + " | ".join(cells) + " |")
    return (f"The command's fixed cost, medians of {results['rounds']} alternating rounds on "
            f"{results.get('cores', '?')} cores: start-up and finishing as its summary line gives them "
            "(tenths of a second); before the run, from the process's start to the run's (Python, imports, "
            "options).\n\n" + "\n".join(lines))


def reader_gcs(results: Mapping) -> str:
    """Reader (a)'s median images/s from each source, its ratios to gs:// at 0 ms and to local disk,
    and the cores the storage server kept busy meanwhile."""
    medians = {name: statistics.median(r) for name, r in results["rates"].items()}
    zero, local = medians.get("gs:// 0 ms"), medians["local disk"]
    lines = ["| source | images/s | ÷ gs:// at 0 ms | ÷ local disk | server CPU, cores busy |",
             "|---|---:|---:|---:|---:|"]
    for name, rate in medians.items():
        remote = name != "local disk"
        lines.append(f"| {name} | {rate:,.0f} | {times(rate / zero) if remote and zero else '—'} "
                     f"| {times(rate / local) if remote else '—'} "
                     f"| {fmt(results['server_cores'][name], 2) if remote else '—'} |")
    return (f"Reader (a) from gs://: {results['images']:,} records of the benchmark's JPEG dataset, training "
            f"defaults, batch 256; median of {results['rounds']} rounds of {results['seconds']:g} s, each source "
            "in a fresh process.\n\n" + "\n".join(lines))


def reader_pytorch(results: Mapping) -> str:
    """Each PyTorch or Grain reader's median images/s and CPU per image, against ImageFolder (i)."""
    readers = results["readers"]
    base = statistics.median(readers["i"]["images_per_s"]) if "i" in readers else None
    lines = ["| reader | images/s | CPU-s per 1,000 images | ÷ (i) ImageFolder |", "|---|---:|---:|---:|"]
    for key, r in readers.items():
        rate = statistics.median(r["images_per_s"])
        lines.append(f"| {r['label']} | {rate:,.0f} | {statistics.median(r['cpu_s_per_1000']):.2f} "
                     f"| {times(rate / base) if base and key != 'i' else '—'} |")
    return (f"{results['images']:,} images, {results['image_size']}×{results['image_size']} JPEG "
            f"q{results['jpeg_quality']} in {results['num_shards']} shards; {results['workers']} worker processes "
            f"a loader, batch {results['batch_size']}; medians of {results['rounds']} rounds of "
            f"{results['seconds']:g} s.\n\n" + "\n".join(lines))


def framing(results: Mapping) -> str:
    """Each framing's median time over the alternating runs, its rates, and its speed over Beam's."""
    medians = {name: statistics.median(ts) for name, ts in results["seconds"].items()}
    beam = next(iter(medians.values()))
    lines = ["| framing | median ms | min ms | records/s | GB/s | × Beam's |", "|---|---:|---:|---:|---:|---:|"]
    for name, median in medians.items():
        lines.append(f"| {name} | {median * 1e3:,.1f} | {min(results['seconds'][name]) * 1e3:,.1f} "
                     f"| {results['records'] / median:,.0f} | {results['bytes'] / median / 1e9:.2f} "
                     f"| {times(beam / median)} |")
    return (f"{results['records']:,} records, {results['bytes'] / 1e6:,.0f} MB, byte-identical; "
            f"{results['repeat']} alternating runs.\n\n" + "\n".join(lines))


def report_page(results: Mapping) -> str:
    """``bench_report``: the report's median time and CPU in a process with TensorFlow imported, and the
    command's in a fresh one, with the page's size and what it shows."""
    rows = [("make_report (TensorFlow imported)", "report_seconds", "report_cpu_seconds"),
            ("beam-prep report (a fresh process)", "command_seconds", "command_cpu_seconds")]
    lines = ["| what | median s | CPU s |", "|---|---:|---:|"]
    lines += [f"| {label} | {statistics.median(results[wall]):.2f} | {statistics.median(results[cpu]):.2f} |"
              for label, wall, cpu in rows]
    return (f"{results['records']:,} records of {results['image_side']}×{results['image_side']} in "
            f"{results['classes']} classes, {results['groups']:,} groups of copies and near copies "
            f"({results['leak_pairs']:,} pairs across splits, {results['pairs_shown']} shown); a page of "
            f"{results['page_bytes'] / 2**20:.1f} MiB with {results['gallery_images']} gallery images; medians of "
            f"{results['repeat']} runs each, taking turns.\n\n" + "\n".join(lines))


def gzip_levels(results: Mapping) -> str:
    """``bench_gzip``: each compressor's median CPU per record over the rounds, its output over
    the framed records' bytes, and (results that have it) TensorFlow's CPU per record reading it
    back; what beam-prep writes marked."""
    reads = results.get("read_cpu_seconds", {})
    ours = results.get("ours", f"ISA-L level {results['level']}")
    read_head = " TensorFlow's read, CPU µs per record |" if reads else ""
    lines = [f"| compressor | CPU µs per record | output ÷ records | MB per CPU-s |{read_head}",
             "|---|---:|---:|---:|" + ("---:|" if reads else "")]

    def read_cell(name: str) -> str:
        return f" {statistics.median(reads[name]) / results['records'] * 1e6:,.1f} |" if name in reads else ""

    for name, seconds in results["cpu_seconds"].items():
        median = statistics.median(seconds)
        mark = " (beam-prep's)" if name == ours else ""
        lines.append(f"| {name}{mark} | {median / results['records'] * 1e6:,.1f} "
                     f"| {results['sizes'][name] / results['bytes']:.4f} | {results['bytes'] / median / 1e6:,.0f} |"
                     + read_cell(name))
    for name in reads:
        if name not in results["cpu_seconds"]:
            lines.append(f"| {name} | — | 1.0000 | — |{read_cell(name)}")
    return (f"{results['records']:,} records, {results['bytes'] / 1e6:,.1f} MB framed; {results['repeat']} "
            "alternating rounds, medians.\n\n" + "\n".join(lines))


def writer_kernel(results: Mapping) -> str:
    """``bench_writer --kernel``: each variant's medians over its rounds, its CPU per image over the
    first variant's, and the perceptual hash's cost (the default command over it without the hash)."""
    keys = ("images_per_s", "cpu_ms_per_image", "peak_rss_mib", "peak_pss_mib", "peak_uss_mib")
    medians = {}
    for name, rounds in results["results"].items():
        ok = [r for r in rounds if "error" not in r]
        medians[name] = {k: statistics.median(r[k] for r in ok) for k in keys} if ok else None
    first = next(iter(medians.values()))
    lines = ["| variant | images/s | CPU ms/image | ÷ first, CPU | peak RSS MiB | peak PSS MiB | peak USS MiB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in medians.items():
        if m is None:
            lines.append(f"| {name} | failed | | | | | |")
            continue
        ratio = f"{m['cpu_ms_per_image'] / first['cpu_ms_per_image']:.3f}" if first else "—"
        lines.append(f"| {name} | {m['images_per_s']:,.0f} | {m['cpu_ms_per_image']:.2f} | {ratio} "
                     f"| {m['peak_rss_mib']:,.0f} | {m['peak_pss_mib']:,.0f} | {m['peak_uss_mib']:,.0f} |")
    hashed, unhashed = medians.get("kernel"), medians.get("kernel, no perceptual hash")
    if hashed and unhashed:
        lines.append(f"\nThe perceptual hash's cost: the default command's CPU per image "
                     f"{hashed['cpu_ms_per_image'] / unhashed['cpu_ms_per_image']:.3f}x its CPU without it.")
    simd = medians.get("pillow-simd")
    if hashed and simd:
        lines.append(f"The default command per CPU-second: {simd['cpu_ms_per_image'] / hashed['cpu_ms_per_image']:.3f}x "
                     "the same command with pillow-simd (above 1: cheaper).")
    return "\n".join(lines)


def writer_profile(results: Mapping) -> str:
    """``bench_writer --profile``: each stage's share of py-spy's busy samples of the default command,
    and that share of its CPU per image, largest first; the image's own work (``process_image``)
    apart from the work around it. Samples of a blocked thread, or without a Python frame, are
    counted apart and left out of the shares."""
    left_out = ("waiting", "outside Python frames (interpreter start and exit, native threads)")
    samples: Mapping[str, int] = {k: v for k, v in results["samples"].items() if k not in left_out}
    total = sum(samples.values()) or 1
    per_image = results["cpu_ms_per_image"]
    lines = ["| stage | samples | share | CPU ms per image |", "|---|---:|---:|---:|"]
    for stage, count in sorted(samples.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {stage} | {count:,} | {count / total:.1%} | {count / total * per_image:.3f} |")
    image = sum(n for stage, n in samples.items() if stage.startswith("image:"))
    around = sum(n for stage, n in samples.items() if stage.startswith(("record:", "read:", "worker:")))
    lines.append(f"| **all** | {total:,} | 100% | {per_image:.3f} |")
    apart = ", ".join(f"{stage} {results['samples'].get(stage, 0):,}" for stage in left_out)
    lines.append(f"\n{results['images']:,} images, {per_image:.2f} ms of CPU per image (the timed run), "
                 f"{total:,} busy samples at {results['rate']} a second (left out: {apart}). The image's "
                 f"own work (`process_image`): {image / total * per_image:.3f} ms; the worker's work around it "
                 f"(reading, the record, its checksums and counts, the loop): {around / total * per_image:.3f} ms, "
                 f"{around / max(image, 1):.1%} of the image's.")
    return "\n".join(lines)


def _append_median(rounds: Sequence[Mapping], key: str, field: str) -> float | None:
    values = [row[key][field] for row in rounds if not row[key].get("error")]
    return statistics.median(values) if values else None


def _append_bound(rounds: Sequence[Mapping], append: str, listing: str, bound: float, field: str) -> float | None:
    """The median over rounds of ``append ÷ (listing + bound × (a))``, each round's (a) the mean of (a) and
    (a′) where the round has both (they bracket its appends)."""
    ratios = [row[append][field] / (row[listing][field] + bound * _baseline(row, field)) for row in rounds
              if not any(row[k].get("error") for k in (append, listing, "a", "a2") if k in row)]
    return statistics.median(ratios) if ratios else None


def _baseline(row: Mapping, field: str) -> float:
    """A round's (a): the mean of (a) and (a′), run before and after its appends; (a) alone in a round without (a′)."""
    return (row["a"][field] + row["a2"][field]) / 2 if "a2" in row else row["a"][field]


def append(results: Mapping) -> str:
    """Each run's median seconds and CPU seconds against the batch prepared alone (a); then each append
    against the issue's bound (its input's listing plus ``bound`` × (a)), and against the whole dataset's."""
    rounds, labels, s = results["rounds"], results["labels"], results["settings"]
    bound = s["bound"]
    base = {field: _append_median(rounds, "a", field) for field in ("seconds", "cpu_seconds")}
    lines = ["| run | seconds | CPU s | ÷ (a) | ÷ (a), CPU |", "|---|---:|---:|---:|---:|"]
    for key, label in labels.items():
        wall, cpu = (_append_median(rounds, key, field) for field in ("seconds", "cpu_seconds"))
        if wall is None:
            lines.append(f"| {label} | failed | | | |")
            continue
        ratios = ("—", "—") if key == "a" or not base["seconds"] else (
            times(wall / base["seconds"]), times(cpu / base["cpu_seconds"]))
        lines.append(f"| {label} | {wall:.2f} | {cpu:.2f} | {ratios[0]} | {ratios[1]} |")
    first = results["dataset"]
    lines += ["", f"The bound: an append costs at most its input's listing plus {bound:g} × (a) "
                  "(medians over rounds of each round's ratio; at most 1.00 meets it):", "",
              "| append | its bound | ÷ the bound | ÷ the bound, CPU | ÷ (w), the whole dataset prepared |",
              "|---|---|---:|---:|---:|"]
    for key, listing in (("c", "l1"), ("d", "l2")):
        wall = _append_median(rounds, key, "seconds")
        lines.append(f"| {labels[key]} | {labels[listing].split(' ', 1)[0]} + {bound:g} × (a) "
                     f"| {times(_append_bound(rounds, key, listing, bound, 'seconds'))} "
                     f"| {times(_append_bound(rounds, key, listing, bound, 'cpu_seconds'))} "
                     f"| {times(wall / first['seconds'] if wall is not None else None)} |")
    head = (f"A dataset of {s['images']:,} images (`{' '.join(s['flags'])}`), prepared once in "
            f"{first['seconds']:.1f} s, {first['cpu_seconds']:.1f} CPU s ((w)); a batch of {s['new']:,} "
            f"({s['percent']:g}%) appended; medians of {s['rounds']} rounds.\n\n")
    return head + "\n".join(lines)


TABLES: dict[str, Callable[[Mapping], str]] = {
    "writer": writer, "writer-formats": writer_formats, "writer-gcs": writer_gcs, "gcs-read": gcs_read,
    "gcs-clients": gcs_clients, "gcs-clients-tls": gcs_clients,
    "listing": listing, "resize": resize,
    "launcher": launcher, "launcher-append": launcher_append, "duplicates": duplicates, "near-duplicates": near_duplicates,
    "near-search": near_search, "reader": reader, "verify": verify, "startup": startup,
    "framing": framing, "reader-gcs": reader_gcs, "reader-pytorch": reader_pytorch,
    "writer-kernel": writer_kernel, "writer-profile": writer_profile, "gzip": gzip_levels, "append": append,
    "report": report_page,
}
