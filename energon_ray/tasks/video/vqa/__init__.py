"""Video question answering: uniform frames of each video (decoded with ``AVDecoder`` in the Ray
workers) and the question → the answer's tokens.

- ``encoder.py``: the task encoder (``energon_ray.tasks.video_qa.VideoQATaskEncoder``, its home);
- ``data.py``: a synthetic ``VidQASample`` dataset of mp4 videos, written once;
- ``backbone.py``: ``TinyVideoQA`` (per-frame patch tokens + question tokens, answer decoder);
- ``model.py``: ``VideoQATask``, next-token loss on the answer;
- ``conf/``: ``task=video/vqa``, ``dataset=video/vqa/synthetic``, ``backbone=video/vqa/tiny``.
"""
