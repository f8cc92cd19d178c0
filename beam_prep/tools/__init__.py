"""What the other commands do with a dataset: inspect, verify, bench; and the sample tree to try it on."""
