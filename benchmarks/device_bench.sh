#!/usr/bin/env bash
# The 16-core and GPU-feed figures of benchmarks/README.md in one go, on a machine with 16 cores and a
# CUDA GPU (and Ray, PyAV, webdataset, megatron-energon importable). Logs go to $OUT (default ./out);
# the trainer's py-spy profile (if py-spy is on PATH) of the set-up-delay run to $OUT/trainer_pyspy.txt.
#   bash benchmarks/device_bench.sh [samples]
# On a lent GPU machine (no network, 64 MiB per call): stage the wheels here with
# `bash ../shared/device/stage.sh`, then add pydantic and pydantic-core (`pip download --no-deps` for
# cp312; stage.sh thinks that machine has them, it has not, and Ray Data's iter_torch_batches needs
# them) to part 1; botocore (part 3) is not needed here. Copy setup.sh into .devstage/, install part 1
# in one call and part 2 plus this script in the next (within the 30 s the machine stays warm).
#   STEPS="gpu_feed scaling" bash benchmarks/device_bench.sh   # only the steps named
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
N=${1:-24000}; W=/tmp/energon_ray_bench; CPUS=$(nproc)
cd "$(dirname "$0")"
{
  echo "== machine"; nproc; free -g | head -2; df -h /dev/shm | tail -1; nvidia-smi -L
  python3 -c "import sys, torch, ray, av, webdataset, megatron.energon as me; print(sys.version.split()[0], 'torch', torch.__version__, 'ray', ray.__version__, 'av', av.__version__)"
} 2>&1 | tee "$OUT/machine.log"
step() {  # name, seconds, command... (skipped unless $STEPS is unset or names it)
  local name=$1 limit=$2; shift 2
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
}
# in order of what issue 11 still asks (stop 38); the whole takes ~11 minutes of a 16-core machine,
# over the 10 minutes one device call may last: run it as two calls, e.g. STEPS="gpu_feed
# captioning_16cpu" and then the rest by name
# the GPU step with and without the workers' lower priority (if energon_ray_nice comes within 10 % of
# loader-free, make ENERGON_RAY_WORKER_NICE a default); the pinned memory of PIN_AHEAD batches
step gpu_feed 200 python3 bench_gpu_feed.py --samples "$N" --runs 2 --cpus "$CPUS" --workdir $W --only loader_free,energon,energon_ray,energon_ray_nice
step captioning_${CPUS}cpu 200 python3 bench_captioning.py --samples "$N" --runs 2 --cpus "$CPUS" --workdir $W --only energon,webloader,energon_ray
# blends of 8 copies (N/8 samples each) at all CPUs: a metadataset's sample blend and a BlendDataset of
# batches (grouped segments, stop 59; on 2 cores: 0.90x and 1.30x Energon's pass)
step blend8_${CPUS}cpu 150 python3 bench_captioning.py --samples $((N / 8)) --blend 8 --runs 2 --cpus "$CPUS" --workdir $W --only energon,energon_ray
step blend_batches8_${CPUS}cpu 150 python3 bench_captioning.py --samples $((N / 8)) --blend-batches 8 --runs 2 --cpus "$CPUS" --workdir $W --only energon,energon_ray
# memory vs throughput at 16 workers: 64-sample segments (a worker's transient block halves) instead of 64-then-128
step captioning_${CPUS}cpu_seg64 60 python3 bench_captioning.py --samples "$N" --runs 1 --cpus "$CPUS" --workdir $W --only energon_ray --samples-per-segment 64
# and one batch per block (on 2 cores oversubscribed to 16 workers: peak PSS 6709 -> 5783 (64) -> 5258 MiB (32),
# Energon 4192; what it costs in trainer CPU per batch and steady rate only a 16-core machine says)
step captioning_${CPUS}cpu_seg32 60 python3 bench_captioning.py --samples "$N" --runs 1 --cpus "$CPUS" --workdir $W --only energon_ray --samples-per-segment 32
BENCH_PYSPY=$OUT/trainer_pyspy.txt step first_batch_after_setup 60 python3 bench_captioning.py --samples "$N" --runs 1 --cpus "$CPUS" --workdir $W --only energon_ray --setup-delay 10
# what `import torch` (the CUDA build) costs each Ray worker, and which libraries' loading (5 s)
step import_memory 60 python3 probe_import_memory.py
# where a Ray worker's memory lies (heap, anonymous, object store, torch's relocated libraries)
step worker_memory 60 python3 probe_worker_memory.py --samples 6000 --cpus "$CPUS" --workdir $W
# one core left to the trainer (both loaders get CPUS-1): does the GPU step come closer to loader-free?
step gpu_feed_one_core_free 80 python3 bench_gpu_feed.py --samples "$N" --runs 1 --cpus $((CPUS - 1)) --workdir $W
# a packed text blend against Energon at all CPUs (trainer CPU per batch, steady tokens/s after batch 20)
step packed_blend_${CPUS}cpu 150 python3 bench_packed_blend.py --runs 2 --cpus "$CPUS" --batches 1500 --sleep-ms 0 --only energon,ahead --workdir $W/packed_blend
step scaling 150 bash -c "for c in 4 8; do timeout 75 python3 bench_captioning.py --samples $N --runs 1 --cpus \$c --workdir $W --only energon,energon_ray; done"
echo "== done ($(date +%T))"
