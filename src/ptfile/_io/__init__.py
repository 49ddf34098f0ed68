"""Bytes in and out, with no knowledge of any checkpoint format.

=====================  ===================================================================
:mod:`.local`          local sources (paths, file objects, bytes, maps), the one place
                       that tells a URL from a path (``url_scheme``), and the one atomic
                       write helper every writer goes through (file modes as ``open``)
:mod:`.remote`         fsspec URLs read by ranges (HTTP, S3, GCS, the Hub), with retries;
                       ``local_path``, the one rule turning a ``file://`` URL into a path
:mod:`.directory`      the files of a directory, local or by URL (DCP folders, sharded models)
:mod:`.progress`       progress bars for long work (tqdm when installed, else none)
=====================  ===================================================================

Nothing here imports numpy, fsspec or tqdm at import time; each is imported on first use.
"""
