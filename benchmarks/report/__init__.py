"""The performance pages (docs/performance/) and the headline figures, rendered from committed results.

``python -m benchmarks.report`` renders; ``--check`` says which page differs.
"""
