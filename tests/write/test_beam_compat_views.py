"""``beam_compat.views_once``: a pipeline's options make each view once, and answer as Beam's own
(the runs through them: tests/write/test_run.py and every command test)."""
from __future__ import annotations

import pickle

import apache_beam as beam
from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TypeOptions

from beam_prep.write.run.beam_compat import views_once


def test_values_are_shared_both_ways_and_a_view_is_made_once():
    options = PipelineOptions(["--runner", "DirectRunner", "--direct_num_workers", "2"])
    once = views_once(options)
    assert once.view_as(StandardOptions) is once.view_as(StandardOptions)
    assert once.view_as(DirectOptions).direct_num_workers == 2
    once.view_as(DirectOptions).direct_num_workers = 3
    assert options.view_as(DirectOptions).direct_num_workers == 3
    options.view_as(StandardOptions).runner = "FnApiRunner"
    assert once.view_as(StandardOptions).runner == "FnApiRunner"
    assert views_once(once) is once
    again = pickle.loads(pickle.dumps(once))
    assert again.view_as(DirectOptions).direct_num_workers == 3
    assert again.get_all_options() == options.get_all_options()


def test_the_views_a_pipeline_makes_do_not_grow_with_its_transforms(monkeypatch):
    made: list[str] = []
    init = PipelineOptions.__init__

    def counting(self, *args, **kwargs):
        made.append(type(self).__name__)
        init(self, *args, **kwargs)

    def views(options: PipelineOptions, maps: int) -> int:
        made.clear()
        p = beam.Pipeline(options=options)  # built, not run: the views are asked for as it is built
        numbers = p | beam.Create(range(20))
        for i in range(maps):
            numbers = numbers | f"Add{i}" >> beam.Map(lambda x: x + 1)
        return len(made)

    monkeypatch.setattr(pipeline_options.PipelineOptions, "__init__", counting)
    flags = ["--runner", "DirectRunner", "--direct_running_mode", "in_memory"]
    # Beam's own options: views for each transform applied (its type checks among them).
    assert views(PipelineOptions(flags), 12) >= views(PipelineOptions(flags), 2) + 10
    assert views(views_once(PipelineOptions(flags)), 12) == views(views_once(PipelineOptions(flags)), 2)
    assert TypeOptions.__name__ in made
