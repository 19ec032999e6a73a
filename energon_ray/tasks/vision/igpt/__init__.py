"""Generative pixels (iGPT), as in Lightning Transformers' "Customizing Tasks": images become
sequences of quantised colours, a small GPT predicts each pixel from the ones before it, and an
optional head classifies the image.

- ``encoder.py``: ``PixelQuantizer`` (the task's tokenizer: colours → ids) and ``ImageGPTTaskEncoder``;
- ``data.py``: a synthetic dataset of small patterned images in a few classes, written once;
- ``backbone.py``: ``GPT2`` (start token, causal blocks, next-pixel head, classification head);
- ``model.py``: ``GenerativePixelsTask`` (next-pixel loss, plus the classification loss with ``classify``);
- ``conf/``: ``task=vision/igpt``, ``dataset=vision/igpt/synthetic``, ``backbone=vision/igpt/gpt2``,
  ``tokenizer=pixels``.
"""
