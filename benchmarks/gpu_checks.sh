#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run on a machine with PyTorch and a C++ compiler
# (no registry needed): Shoal installed in place, then
#   planner_gpu      the planner's step time and memory against one GPU (planner_gpu.py)
#   cuda_tests       the tests marked gpu: the calibration probe on the GPU, CUDA tensors on
#                    the host-staged backend, DDP on a GPU model
#   gpu_allreduce    the host-staged backend against gloo on CUDA tensors
# Logs and the planner's JSON go to $OUT (or the folder given).
#     bash benchmarks/gpu_checks.sh [OUT_DIR]
set -u
out=${OUT:-${1:-gpu-checks}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 SHOAL_EXTENSION_DIR=/tmp/shoal-ext

step() {  # step NAME SECONDS COMMAND...: the command's log in $out/NAME.log, its tail here
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc in $(( $(date +%s) - start )) s"
    tail -n 30 "$out/$name.log"
    return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | tee "$out/gpu.txt"
$py -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)' | tee -a "$out/gpu.txt"
step install 150 $py -m pip install --no-deps --no-build-isolation --no-index -e . || exit 1
step planner_gpu 150 $py benchmarks/planner_gpu.py --json "$out/planner_gpu.json"
# -x and a per-test limit: a failure or a hang still prints its traceback (or stacks)
step cuda_tests 220 $py -m pytest -q -x --timeout 60 -p no:cacheprovider -m gpu \
    tests/integration/test_profiler_calibration_cuda.py tests/integration/test_torch_cuda.py
step gpu_allreduce 90 $py benchmarks/gpu_allreduce.py --rounds 10
