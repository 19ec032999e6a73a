"""Benchmark: keyframe seeking vs whole-file decoding in AVDecoder, and peak memory of uniform clips.

Seek part (always): encodes a 60 s h264 video (320x240, 30 fps, a keyframe every 2 s) and times,
side by side in one process and interleaved run by run, decoding a 2 s clip from the middle with
``AVDecoder.get_clips`` against decoding the whole file with ``AVDecoder.get_video`` (and against a
bare PyAV pass that decodes every frame without converting it). Each measurement uses a fresh
``AVDecoder``, so the per-file frame index is part of the seek time.

Memory part (``--memory``): encodes a 10-minute 1280x720 video once (libx264 ultrafast, low
bitrate), then, in a fresh Python process, extracts 8 uniform 1 s clips and reports the peak RSS.

Usage:
    python benchmarks/bench_av_seek.py [--runs 7] [--memory] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import av
import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_video(
    path: Path, *, seconds: int, width: int, height: int, fps: int, gop: int, preset: str, quality: Dict[str, str]
) -> Path:
    """Encode a moving test pattern as h264/mp4; frames are built directly in yuv420p (cheap).

    ``quality`` holds libx264 options: ``{"crf": "28"}`` or a bitrate cap ``{"b": "500k", ...}``.
    """
    rng = np.random.default_rng(0)
    texture = rng.integers(16, 235, size=(height * 2, width * 2), dtype=np.uint8)
    texture = (texture // 32 * 32 + 16).astype(np.uint8)  # blocky: compressible but not trivial
    chroma = np.full((height // 2, width), 128, dtype=np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps, options={"preset": preset, "sc_threshold": "0", **quality})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        for i in range(seconds * fps):
            dy, dx = (i * 2) % height, (i * 3) % width
            luma = texture[dy : dy + height, dx : dx + width]
            frame = av.VideoFrame.from_ndarray(np.vstack([luma, chroma]), format="yuv420p")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


def cached_video(cache: Path, name: str, **spec) -> Path:
    """Encode the video into ``cache`` unless a file of that name is already there."""
    path = cache / name
    if not path.exists():
        started = time.perf_counter()
        write_video(path, **spec)
        print(f"encoded {name}: {path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - started:.1f}s")
    return path


def bare_full_decode(data: bytes) -> int:
    """Decode every frame with plain PyAV, no RGB conversion: the cheapest possible full pass."""
    import io

    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def time_side_by_side(cases: Dict[str, Callable[[], object]], runs: int) -> Dict[str, List[float]]:
    """Run every case once per round, ``runs`` rounds, so drift affects all cases alike."""
    times: Dict[str, List[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return times


def seek_benchmark(cache: Path, runs: int) -> None:
    """Time a 2 s clip from the middle of a 60 s video against whole-file decodes, and print the table."""
    from energon_ray.decode.av import AVDecoder

    path = cached_video(cache, "seek_60s_320x240.mp4", seconds=60, width=320, height=240, fps=30, gop=60,
                        preset="veryfast", quality={"crf": "28"})
    data = path.read_bytes()
    clip = AVDecoder(data).get_clips(video_clip_ranges=[(29.0, 31.0)])
    frames = clip.video_clips[0].shape[0]
    cases = {
        "seek: 2 s clip @ 29-31 s (get_clips)": lambda: AVDecoder(data).get_clips(video_clip_ranges=[(29.0, 31.0)]),
        "full: every frame to RGB (get_video)": lambda: AVDecoder(data).get_video(),
        "full: bare PyAV decode, no RGB": lambda: bare_full_decode(data),
    }
    AVDecoder(data).get_video()  # warm-up (codec init, page cache)
    times = time_side_by_side(cases, runs)
    medians = {name: statistics.median(t) for name, t in times.items()}
    seek = medians[next(iter(cases))]
    print(f"\n60 s, 320x240, 30 fps, GOP 2 s, h264 ({len(data) / 1e6:.1f} MB); "
          f"clip = {frames} frames; {runs} runs each")
    print(f"{'case':42s} {'median ms':>10s} {'min ms':>9s} {'max ms':>9s} {'vs seek':>8s}")
    for name, t in times.items():
        low, high = min(t) * 1e3, max(t) * 1e3
        print(f"{name:42s} {medians[name] * 1e3:10.1f} {low:9.1f} {high:9.1f} {medians[name] / seek:7.1f}x")


def memory_benchmark(cache: Path) -> None:
    """Extract 8 uniform 1 s clips from a 10-minute 720p video in fresh processes; print their peak RSS.

    Two processes: "lean" imports only what decoding needs (numpy, av, torch and the decoder
    modules, without ``energon_ray/__init__`` and the Ray/Arrow stack it pulls in); "package" imports
    ``energon_ray`` as a Ray worker would.
    """
    path = cached_video(cache, "memory_10min_1280x720.mp4", seconds=600, width=1280, height=720, fps=30, gop=60,
                        preset="ultrafast", quality={"b": "500k", "maxrate": "500k", "bufsize": "1M"})
    size_mb = path.stat().st_size / 1e6
    print(f"\n8 uniform 1 s clips from 10 min 1280x720 ({size_mb:.1f} MB file), fresh process each:")
    header = ("process", "imports", "+file", "clips", "peak", "overhead", "time")
    print("{:8s} {:>8s} {:>7s} {:>7s} {:>7s} {:>9s} {:>6s}  (MiB, s)".format(*header))
    for mode in ("lean", "package"):
        cmd = [sys.executable, __file__, "--_measure", str(path), "--_mode", mode]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO).stdout
        r = json.loads(out.splitlines()[-1])
        clips_mb = r["output_bytes"] / 2**20
        overhead = r["peak_rss_mb"] - r["rss_before_mb"] - clips_mb
        verdict = "OK" if r["peak_rss_mb"] < 1024 else "over 1 GiB"
        print(f"{mode:8s} {r['rss_imports_mb']:8.0f} {r['rss_before_mb'] - r['rss_imports_mb']:7.0f} {clips_mb:7.0f} "
              f"{r['peak_rss_mb']:7.0f} {overhead:9.0f} {r['seconds']:6.2f}  {verdict}")
    print(f"  clip shapes: {r['shapes']}; overhead = peak - (imports + file + clips)")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _measure(path: str, mode: str) -> None:
    """Child process: decode the clips and print one JSON line with the figures."""
    if mode == "lean":  # make ``energon_ray`` a bare package so its __init__ (Ray, Arrow, ...) is not run
        import types

        package = types.ModuleType("energon_ray")
        package.__path__ = [str(REPO / "energon_ray")]
        sys.modules["energon_ray"] = package
    import torch  # noqa: F401  (counted in the import baseline in both modes)

    from energon_ray.decode.av import AVDecoder, get_clips_uniform

    imports = _rss_mb()
    data = Path(path).read_bytes()
    before = _rss_mb()
    started = time.perf_counter()
    clips = get_clips_uniform(AVDecoder(data, key=path), clip_duration_seconds=1.0, num_clips=8, request_video=True)
    elapsed = time.perf_counter() - started
    print(json.dumps({
        "shapes": sorted({tuple(c.shape) for c in clips.video_clips}),
        "output_bytes": sum(c.numel() for c in clips.video_clips),
        "seconds": elapsed,
        "rss_imports_mb": imports,
        "rss_before_mb": before,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per case (>= 5)")
    parser.add_argument("--memory", action="store_true", help="also run the 10-minute 720p memory check")
    parser.add_argument("--cache-dir", type=Path, default=None, help="keep generated videos here between runs")
    parser.add_argument("--_measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_mode", default="package", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        _measure(args._measure, args._mode)
        return
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    with tempfile.TemporaryDirectory(prefix="bench_av_") as tmp:
        cache = args.cache_dir or Path(tmp)
        cache.mkdir(parents=True, exist_ok=True)
        seek_benchmark(cache, args.runs)
        if args.memory:
            memory_benchmark(cache)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
