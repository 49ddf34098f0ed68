"""``torch.distributed.checkpoint`` directories: every DCP module but two lives here.

=====================  ===================================================================
:mod:`.items`          what an item's bytes are (its kind, decided once) and their readers
:mod:`.load`           :func:`ptfile.load_dcp` and the building blocks: the metadata, tensors
                       assembled from chunks, values read by the policies
:mod:`.hf`             the HuggingFace storage writer's folders (``*.safetensors`` shards,
                       with or without consolidation) as DCP metadata
:mod:`.reader`         :class:`ptfile.DCPReader`: :func:`ptfile.open` on a DCP directory
:mod:`.writer`         :func:`ptfile.save_dcp`: a DCP directory as ``dcp.save`` writes it
:mod:`.consolidate`    a DCP directory to one ``.pt`` file, shard by shard
=====================  ===================================================================

The metadata pickle's model is :mod:`ptfile.formats.dcp_metadata` (a format), and the
scanner's walk of a directory is :mod:`ptfile.scanning.dcp`.
"""
