"""torch's object model, as plain data over numpy: what a checkpoint's pickle rebuilds.

=====================  ===================================================================
:mod:`.dtypes`         every torch dtype: its numpy dtype (ml_dtypes for bfloat16/float8,
                       imported on first use), its legacy storage class, its safetensors code
:mod:`.tensor`         Tensor, Storage, Parameter, Size, Device, sparse and quantized tensors
:mod:`.location`       storage location tags (``cpu``, ``cuda:0``) and ``map_location``
:mod:`.selection`      slices of a tensor (``get_slice``), checked against its shape
:mod:`.tree`           the one walk of an object tree: state-dict names, values, the bound
:mod:`.torch`          the torch bridge (the only module that imports torch)
=====================  ===================================================================
"""
