"""Image captioning: a tiny vision encoder and a tiny transformer decoder that writes the caption.

- ``encoder.py``: the task encoder (``energon_ray.tasks.captioning.CaptioningTaskEncoder``, its home);
- ``data.py``: a synthetic captioning dataset, written and prepared on first use;
- ``backbone.py``: ``TinyCaptioner`` (patch encoder + causal decoder with cross-attention);
- ``model.py``: ``CaptioningTask``, next-token loss on the caption tokens;
- ``conf/``: the Hydra configs ``task=vision/captioning``, ``dataset=vision/captioning/synthetic``,
  ``backbone=vision/captioning/tiny``.
"""
