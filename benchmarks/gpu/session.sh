#!/usr/bin/env bash
# What a lent GPU machine runs (../.library/device): set up, then each named step, logs and results under $OUT.
#   benchmarks/gpu/session.sh info kernel-tests bench tune listops-data listops-probe
# The machine has Python 3.12 with jax, flax, optax, orbax-checkpoint and chex; the project's other needs travel
# as wheels in .whl (see benchmarks/gpu/README.md). Each step has its own time limit so one slow step cannot
# take the whole call.
set -u
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
if [ -d .whl ] && [ -z "${WHEELS_DONE:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export WHEELS_DONE=1
fi
export PYTHONPATH=/tmp/site:$PWD
# Extra arguments per step, as whitespace-separated words.
read -ra bench_args <<<"${BENCH_ARGS:-}"
read -ra probe_args <<<"${PROBE_ARGS:-}"
read -ra train_args <<<"${TRAIN_ARGS:-}"
mkdir -p runs/gpu

step() {  # step NAME SECONDS COMMAND...: runs with a limit, logs to $OUT/NAME.log, prints the last lines
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T), limit ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name rc=$? in $((SECONDS - start))s"
}

for s in "$@"; do
  case $s in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
      "$PY" -c "import jax, jaxlib, flax, optax, chex; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__, 'optax', optax.__version__); print(jax.devices())"
      ;;
    kernel-tests)
      # -v: every result on its own line as it happens (a cut-off run still says which failed and why, -rf
      # prints the reasons only at the end). TESTS="tests/kernels/test_relu_attention_mgpu.py
      # tests/kernels/test_linear_attention_mgpu.py tests/kernels/test_platforms.py": the Mosaic GPU kernels
      # alone (never yet run on hardware) and the compute-capability choice. TESTS is split on spaces.
      # shellcheck disable=SC2086
      step kernel-tests "${TESTS_LIMIT:-240}" env JAX_PLATFORMS=cuda "$PY" -m pytest ${TESTS:-tests/kernels} -v -n 8 \
        -p no:cacheprovider -p no:benchmark --timeout=120 --tb=line -rf --durations=5
      grep -E "PASSED|FAILED|passed|failed|Error" "$OUT/kernel-tests.log" | cut -c1-300 | tail -60
      ;;
    bench)
      step bench "${BENCH_LIMIT:-330}" env JAX_PLATFORMS=cuda "$PY" -m kernels.bench --out "$OUT/bench" --lengths=1024,4096,16384 \
        --head_dims=128 --dtypes=bfloat16 --check_max_length=4096 --repeats=5 "${bench_args[@]}"
      grep -E "^\[" "$OUT/bench.log" | cut -c1-200
      ;;
    tune)
      step tune "${TUNE_LIMIT:-150}" env JAX_PLATFORMS=cuda "$PY" -m kernels.bench --out "$OUT/tune" --lengths=4096 --head_dims=128 \
        --dtypes=bfloat16 --causal=true --ops=relu,linear --relu_impls=pallas --linear_impls=pallas --check=false \
        --relu_blocks="64,64,64,64;128,64,64,64,8,3;128,128,64,64,8,3;64,64,64,64,4,3" --linear_blocks="32;64;128"
      grep -E "^\[" "$OUT/tune.log" | cut -c1-200
      ;;
    listops-data)  # CPU only, in the background: the 96k/2k/2k generated splits and their caches
      setsid env JAX_PLATFORMS=cpu "$PY" -c "
from lra_flax.configs import listops
from lra_flax.tasks import listops as task
print(task.prepare(listops.get_config('lra_code')))" >"$OUT/listops-data.log" 2>&1 &
      ;;
    listops-probe)  # steps/s and memory of the lra_code ListOps model per mixer (synthetic batches)
      for m in ${MIXERS:-softmax relu linear}; do
        step "probe-$m" 120 env JAX_PLATFORMS=cuda "$PY" -m lra_flax.efficiency --config=lra_flax/configs/listops.py:lra_code \
          --config.model.mixer="$m" "${probe_args[@]}" --steps=10 --output="$OUT/probe-$m.json"
        tail -c 400 "$OUT/probe-$m.log"
      done
      ;;
    listops-train)  # lra_code ListOps, 5k steps, one process per mixer side by side on the one GPU
      JAX_PLATFORMS=cpu "$PY" -c "
from lra_flax.configs import listops
from lra_flax.tasks import listops as task
task.prepare(listops.get_config('lra_code'))" >"$OUT/listops-prepare.log" 2>&1 || { tail "$OUT/listops-prepare.log"; exit 1; }
      pids=()
      for m in ${MIXERS:-relu softmax linear}; do
        timeout "${TRAIN_LIMIT:-520}" env JAX_PLATFORMS=cuda "$PY" -m lra_flax.main --config=lra_flax/configs/listops.py:lra_code \
          --workdir="runs/gpu/listops-$m" --config.model.mixer="$m" "${train_args[@]}" >"runs/gpu/listops-$m.log" 2>&1 &
        pids+=($!)
      done
      sleep 90; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
      for p in "${pids[@]}"; do wait "$p"; echo "rc=$?"; done
      for m in ${MIXERS:-relu softmax linear}; do echo "--- $m"; grep -E "step|acc" "runs/gpu/listops-$m.log" | tail -4 | cut -c1-250; done
      tar czf "$OUT/listops.tgz" --exclude=checkpoints runs/gpu/listops-*
      ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
