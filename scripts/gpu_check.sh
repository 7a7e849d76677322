#!/usr/bin/env bash
# `make gpu-check`, on the GPU machine (Python 3.12, torch with CUDA; nothing can be downloaded there).
# Needs the two folders scripts/gpu_check_prepare.sh makes here, carried along: .whl and .gpucheck.
#   1. install the carried wheels into /tmp/site (PYTHONPATH)
#   2. build a random-weight SmolLM2-135M from the real config (bench/random_model.py)
#   3. pytest -m gpu (tests/engine/test_gpu.py, tests/grammar/test_bitmask.py's CUDA test)
#   4. the benchmark (bench/gpu_check.py) -> $OUT/gpu_check.json, with the pytest summary folded in
# Everything is logged to $OUT/gpu_check.log. Runs in about 3-5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/formwork-gpu-check}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
PY=${PYTHON:-python3}
if [ -d .whl ] && [ -z "${GPU_CHECK_SKIP_WHEELS:-}" ]; then  # the knob: dry runs on a machine with its own venv
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu-check: installing the carried wheels failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
MODEL=/tmp/formwork-random-smollm2
start=$SECONDS
$PY -m bench.random_model .gpucheck/model "$MODEL" || { echo "gpu-check: building the random model failed"; exit 1; }
echo "random model built in $((SECONDS - start)) s"
export FORMWORK_GPU_MODEL=$MODEL
start=$SECONDS
timeout "${GPU_CHECK_TEST_TIMEOUT:-240}" $PY -m pytest -q -rA -p no:cacheprovider -m gpu \
    tests/engine/test_gpu.py tests/grammar/test_bitmask.py --junitxml="$OUT/pytest.xml"
test_rc=$?
echo "gpu tests: exit $test_rc in $((SECONDS - start)) s"
start=$SECONDS
# GPU_CHECK_BENCH_ARGS: e.g. "--device cpu --quick" for a dry run without a GPU
timeout "${GPU_CHECK_BENCH_TIMEOUT:-200}" $PY -m bench.gpu_check --model "$MODEL" --out "$OUT/gpu_check.json" \
    --pytest-xml "$OUT/pytest.xml" ${GPU_CHECK_BENCH_ARGS:-}
bench_rc=$?
echo "benchmark: exit $bench_rc in $((SECONDS - start)) s"
[ $test_rc -eq 0 ] && [ $bench_rc -eq 0 ]
