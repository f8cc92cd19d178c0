"""Imports beam_prep and checks its names load on first use (the writer's without TensorFlow);
prints ``ok``.

    python -m tests.children.lazy_names

A fresh process, so that nothing else has imported TensorFlow or Beam yet.
"""
import sys

import beam_prep

if __name__ == "__main__":
    assert "tensorflow" not in sys.modules and "apache_beam" not in sys.modules, "imported too early"
    from beam_prep.write.run.write_image_dataset import WriteImageDataset

    assert beam_prep.WriteImageDataset is WriteImageDataset
    assert "tensorflow" not in sys.modules, "the writer's transform imported TensorFlow"
    from beam_prep.reader import load_info, make_dataset

    assert beam_prep.make_dataset is make_dataset and beam_prep.load_info is load_info
    print("ok")
