"""Bytes in and out, with no knowledge of any checkpoint format.

=====================  ===================================================================
:mod:`.local`          local sources (paths, file objects, bytes, maps), the one place that
                       tells a URL from a path (``file://`` normalised once), and the one
                       atomic write helper every writer goes through (file modes as ``open``)
:mod:`.remote`         fsspec URLs read by ranges (HTTP, S3, GCS, the Hub), with retries
:mod:`.directory`      the files of a directory, local or by URL (DCP folders, sharded models)
:mod:`.progress`       progress bars for long work (tqdm when installed, else none)
=====================  ===================================================================

Nothing here imports numpy, fsspec or tqdm at import time; each is imported on first use.
"""
