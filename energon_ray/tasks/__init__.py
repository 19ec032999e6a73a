"""Ready tasks per modality: task encoders, tokenizers and transforms (used by jobs/, notebooks and
benchmarks), and trainable tasks in ``<modality>/<task>/`` (data, backbone, LightningModule and Hydra
configs; run them with ``python -m energon_ray.train``)."""
