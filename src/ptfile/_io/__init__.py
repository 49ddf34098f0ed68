"""Bytes in and out, with no knowledge of any checkpoint format.

=====================  ===================================================================
:mod:`.local`          the Source protocol (capabilities, not classes) and the local
                       sources: paths, file objects, bytes, maps (``open_source``)
:mod:`.paths`          the one place that tells a URL from a path (``url_scheme``)
:mod:`.buffers`        a whole file read into one fresh buffer (``read_file``)
:mod:`.atomic`         the one atomic write helper every writer goes through (file modes
                       as ``open``)
:mod:`.sink`           where a saved file's bytes go: big files written around the page
                       cache (``O_DIRECT``)
:mod:`.remote`         fsspec URLs read by ranges (HTTP, S3, GCS, the Hub), with retries;
                       ``local_path``, the one rule turning a ``file://`` URL into a path
:mod:`.directory`      the files of a directory, local or by URL (DCP folders, sharded models)
:mod:`.progress`       progress bars for long work (tqdm when installed, else none)
=====================  ===================================================================

Nothing here imports numpy, fsspec or tqdm at import time; each is imported on first use.
"""
