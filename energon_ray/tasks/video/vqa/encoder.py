"""The video QA task encoder; its home is :mod:`energon_ray.tasks.video_qa` (notebooks and benchmarks use it)."""

from energon_ray.tasks.video_qa import VideoQABatch, VideoQAEncodedSample, VideoQATaskEncoder, pick_frames

__all__ = ["VideoQABatch", "VideoQAEncodedSample", "VideoQATaskEncoder", "pick_frames"]
