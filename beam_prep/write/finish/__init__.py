"""Finishing a dataset once its shards are written: the duplicates among its records
(``duplicates``) and the manifest, built from what the shards report and published with them (``manifest``)."""
