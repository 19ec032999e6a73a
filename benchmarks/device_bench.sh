#!/usr/bin/env bash
# The 16-core and GPU-feed figures of benchmarks/README.md in one go, on a machine with 16 cores and a
# CUDA GPU (and Ray, PyAV, webdataset, megatron-energon importable). Logs go to $OUT (default ./out);
# the trainer's py-spy profile (if py-spy is on PATH) of the set-up-delay run to $OUT/trainer_pyspy.txt.
#   bash benchmarks/device_bench.sh [samples]
# On a lent GPU machine (no network, 64 MiB per call): stage the wheels here with
# `bash ../shared/device/stage.sh pydantic pydantic-core annotated-types typing-inspection` (Ray Data's
# iter_torch_batches needs pydantic, which that machine lacks), repack into parts under ~58 MiB (Ray's
# wheel without ray/dashboard/client, rllib, serve, llm fits beside botocore), copy setup.sh into
# .devstage/, install part 1 in one call and part 2 plus this script in the next (within 30 s).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
N=${1:-24000}; W=/tmp/energon_ray_bench; CPUS=$(nproc)
cd "$(dirname "$0")"
{
  echo "== machine"; nproc; free -g | head -2; df -h /dev/shm | tail -1; nvidia-smi -L
  python3 -c "import sys, torch, ray, av, webdataset, megatron.energon as me; print(sys.version.split()[0], 'torch', torch.__version__, 'ray', ray.__version__, 'av', av.__version__)"
} 2>&1 | tee "$OUT/machine.log"
step() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T))"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
}
step captioning_${CPUS}cpu 380 python3 bench_captioning.py --samples "$N" --runs 3 --cpus "$CPUS" --workdir $W --only energon,webloader,ray_data,energon_ray,energon_ray_no_local
step gpu_feed 200 python3 bench_gpu_feed.py --samples "$N" --runs 2 --cpus "$CPUS" --workdir $W
BENCH_PYSPY=$OUT/trainer_pyspy.txt step first_batch_after_setup 60 python3 bench_captioning.py --samples "$N" --runs 1 --cpus "$CPUS" --workdir $W --only energon_ray --setup-delay 10
# memory vs throughput at 16 workers: 256 MiB of finished blocks ahead instead of the 1 GiB default
step captioning_${CPUS}cpu_store256 120 python3 bench_captioning.py --samples "$N" --runs 1 --cpus "$CPUS" --workdir $W --only energon_ray --object-store-mib 256
step scaling 180 bash -c "for c in 4 8; do timeout 90 python3 bench_captioning.py --samples $N --runs 1 --cpus \$c --workdir $W --only energon,energon_ray; done"
# one core left to the trainer (both loaders get CPUS-1): does the GPU step come closer to loader-free?
step gpu_feed_one_core_free 150 python3 bench_gpu_feed.py --samples "$N" --runs 1 --cpus $((CPUS - 1)) --workdir $W
echo "== done ($(date +%T))"
