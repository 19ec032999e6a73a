"""A language model on packed sequences: documents tokenized and packed first-fit-decreasing into
fixed-length rows in the Ray workers; attention stays inside each document.

- ``encoder.py``: the task encoder (``energon_ray.tasks.text_packing.TextPackingTaskEncoder``, its home);
- ``data.py``: a synthetic ``TextSample`` corpus, written once;
- ``backbone.py``: ``PackedGPT`` (positions restart per document, block-diagonal causal attention);
- ``model.py``: ``PackedLMTask``, next-token loss on the packed rows' labels;
- ``conf/``: ``task=text/lm_packing``, ``dataset=text/lm_packing/synthetic``, ``backbone=text/lm_packing/gpt``.
"""
