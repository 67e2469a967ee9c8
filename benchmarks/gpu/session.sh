#!/usr/bin/env bash
# What a lent GPU machine runs, one device-tool call at a time (benchmarks/gpu/README.md has the plan):
#
#   benchmarks/gpu/session.sh [--dry-run] STEP...
#
#   info          GPU, driver, CUDA and Python package versions; what kernels.auto's table picks on this machine
#   data          generate the lra_code ListOps splits on the CPU, in the background and in a process session
#                 of its own, so it goes on after the call (started first whenever a later step needs them);
#                 `train` waits for it
#   kernel-tests  every kernel test file in its own pytest process under `timeout -k` (a hang or an abort
#                 costs that file only), all files side by side; each failure's full report in
#                 $OUT/failures.txt as it happens, JUnit reports in $OUT/junit/, and each file's result in
#                 $OUT/kernel_tests.json (benchmarks/gpu/summarise_tests.py)
#   probe         steps/s and memory of the lra_code ListOps model per mixer (synthetic batches)
#   train         lra_code ListOps per mixer, side by side, each resumed from runs/gpu/listops-MIXER; at
#                 TRAIN_LIMIT it gets SIGTERM, saves a checkpoint and stops (exit 75): the next call goes on
#   bench         the kernel benchmark (kernels.bench) sweep
#   studies       the studies named in STUDIES at their `gpu` preset (`python -m studies.NAME --gpu`, each planned at
#                 ≤ 8 minutes on one H100), one after another within STUDY_LIMIT seconds for the whole step; one
#                 stopped at the limit resumes its runs from runs/studies/ on the next call (and the step stops
#                 there); result.json, README.md, figure and log go to $OUT/studies/NAME
#   pack          (name it last) everything under $OUT into $OUT/session.tar.gz, beside copies of the few files
#                 read first: the device tool brings back at most 8 files, at most 2 folders down
#
# Everything a step writes that must come back goes under $OUT; what must survive between calls on the same
# machine (workdirs, data, the compilation cache) goes under runs/gpu/, which git ignores, so it stays.
# --dry-run: every step at toy sizes on the CPU (CI runs it: tests/test_gpu_session.py).
#
# Settings (environment): OUT, GPU_STATE (default runs/gpu), PY (python), COMMIT, MIXERS (train and probe;
# default "softmax relu"), TRAIN_ARGS, PROBE_ARGS, BENCH_ARGS, PYTEST_ARGS (extra words), KERNEL_TESTS (files),
# WIDE_FILES (test files given 4 workers), FILE_LIMIT, TEST_LIMIT, TRAIN_LIMIT, BENCH_LIMIT, STUDY_LIMIT, DATA_WAIT,
# KILL_GRACE (seconds), TRAIN_FAULT (a fault injected into the training processes, as the tests inject them: e.g.
# sigterm_after_step=3), STUDIES (names).
set -u
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY_RUN=1
  shift
fi
if [ $# -eq 0 ]; then
  sed -n '2,33p' "$0"
  exit 2
fi
for s in "$@"; do
  case $s in info | data | kernel-tests | probe | train | bench | studies | pack) ;; *)
    echo "session.sh: unknown step '$s'; valid: info data kernel-tests probe train bench studies pack" >&2
    exit 2
    ;;
  esac
done

cd "$(dirname "$0")/../.." || exit 1
STATE=${GPU_STATE:-runs/gpu}
OUT=${OUT:-$STATE/out}
mkdir -p "$OUT" "$STATE" || exit 1
OUT=$(cd "$OUT" && pwd) STATE=$(cd "$STATE" && pwd)
PY=${PY:-python3}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# Compiled programs are cached across calls on the same machine (runs/ stays there between calls).
export JAX_COMPILATION_CACHE_DIR=$STATE/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
if [ $DRY_RUN = 0 ] && [ -d .whl ] && [ -z "${WHEELS_DONE:-}" ]; then # the wheels are the GPU machine's (cp312)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    exit 1
  export WHEELS_DONE=1 PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
read -ra train_args <<<"${TRAIN_ARGS:-}"
read -ra probe_args <<<"${PROBE_ARGS:-}"
read -ra bench_args <<<"${BENCH_ARGS:-}"
read -ra pytest_args <<<"${PYTEST_ARGS:-}"

LISTOPS_DIR=$STATE/data/listops
if [ $DRY_RUN = 1 ]; then
  export JAX_PLATFORMS=cpu
  PLATFORM=cpu
  DATA_SIZES=(--num_train=64 --num_valid=16 --num_test=16 --min_length=20 --max_length=64 --max_depth=4
    --max_args=4)
  # The lra_code preset at toy size: the same code path, seconds instead of minutes.
  LISTOPS_TOY=(--config.model.num_layers=1 --config.model.d_model=32 --config.model.num_heads=2
    --config.model.mlp_dim=32 --config.model.max_length=64 --config.train.batch_size=4 --config.train.steps=6
    --config.train.warmup_steps=2 --config.train.log_every=1 --config.train.eval_every=3
    --config.train.checkpoint_every=3)
  KERNEL_SELECT=()
  if [ -z "${KERNEL_TESTS:-}" ]; then # one cheap test a file: the harness is what a dry run checks
    KERNEL_TESTS="tests/kernels/test_relu_attention_triton.py tests/kernels/test_linear_attention_triton.py
      tests/kernels/test_relu_attention_mosaic_gpu.py tests/kernels/test_linear_attention_mosaic_gpu.py
      tests/kernels/test_auto.py"
    KERNEL_SELECT=(-k "default_block_sizes or block_dv_must or refuses or malformed_entry")
  fi
  BENCH_SIZES=(--lengths=64 --tokens=64 --heads=2 --head_dims=32 --dtypes=float32 --repeats=1 --check_max_length=64)
  FILE_LIMIT=${FILE_LIMIT:-240} TRAIN_LIMIT=${TRAIN_LIMIT:-240} BENCH_LIMIT=${BENCH_LIMIT:-120}
  STUDY_LIMIT=${STUDY_LIMIT:-240} STUDY_PRESET=--tiny STUDIES=${STUDIES:-variance}
  WORKERS=1
else
  export JAX_PLATFORMS=cuda
  PLATFORM=cuda
  DATA_SIZES=()
  LISTOPS_TOY=()
  # The Triton and Mosaic GPU kernels, then what every GPU run of the ops goes through. Not the *_tpu.py files:
  # their kernels run on a TPU only.
  KERNEL_TESTS=${KERNEL_TESTS:-tests/kernels/test_relu_attention_triton.py tests/kernels/test_linear_attention_triton.py
    tests/kernels/test_relu_attention_mosaic_gpu.py tests/kernels/test_linear_attention_mosaic_gpu.py tests/kernels/test_auto.py
    tests/kernels/test_relu_attention.py tests/kernels/test_linear_attention.py tests/kernels/test_input_checks.py
    tests/kernels/test_softmax_attention.py tests/kernels/test_dropout_bits.py tests/kernels/test_bench.py}
  KERNEL_SELECT=()
  # kernels.bench's accelerator default is the targets' sweep (T 4K and 16K, causal and not, D 128 and 64, bf16:
  # the kernel builds beside cuDNN), shape by shape. BENCH_ARGS adds to it (--xla=true: the crossovers auto needs).
  BENCH_SIZES=()
  # A lease is 15 minutes of device time, a call at most 10: the plan sets these per call (benchmarks/gpu/README.md).
  FILE_LIMIT=${FILE_LIMIT:-240} TRAIN_LIMIT=${TRAIN_LIMIT:-360} BENCH_LIMIT=${BENCH_LIMIT:-250}
  # Each preset is planned at ≤ 8 minutes (studies/common.py): one or two a call, named in STUDIES (the order:
  # benchmarks/gpu/README.md). A call is at most 600 s: the step's limit leaves the SIGKILL grace inside it.
  STUDY_LIMIT=${STUDY_LIMIT:-500} STUDY_PRESET=--gpu STUDIES=${STUDIES:-}
  WORKERS=2
  # The files that ran longest on the H200 (2026-11-28: killed at 170 s with 2 workers; the linear Mosaic GPU file
  # took 101 s alone with 4) get 4 workers; the machine has 16 cores for 13 files.
  WIDE_FILES=${WIDE_FILES:-test_linear_attention_mosaic_gpu.py test_softmax_attention.py test_relu_attention.py}
fi
TEST_LIMIT=${TEST_LIMIT:-180}
KILL_GRACE=${KILL_GRACE:-60} # the kernel tests, probe and bench; a training gets 90 s to save its checkpoint
case $KILL_GRACE in '' | *[!0-9]* | 0)
  echo "session.sh: KILL_GRACE must be a whole number of seconds ≥ 1 (0 would never kill), got '$KILL_GRACE'" >&2
  exit 2
  ;;
esac
MIXERS=${MIXERS:-softmax relu}

note() { echo "=== $* ($(date +%T))"; }

log_words() { # log_words [-e PATTERN]... LOG: the log without blank lines and pytest-benchmark's warnings about xdist
  grep -v -e PytestBenchmarkWarning -e 'warner(' -e '^$' "$@"
}

copy_data_log() { [ -f "$STATE/data.log" ] && cp "$STATE/data.log" "$OUT/data.log"; }

limited() { # limited SECONDS LOG COMMAND...: runs with a time limit (SIGTERM, SIGKILL KILL_GRACE s later); returns
  # its status
  local limit=$1 log=$2
  shift 2
  timeout -k "$KILL_GRACE" "$limit" "$@" >"$log" 2>&1
}

start_data() { # the ListOps splits, generated once on the CPU in their own process session: the generation goes
  # on after this call returns (the device tool ends a call's other processes) and the next call finds it done
  [ -f "$LISTOPS_DIR.done" ] && return 0
  [ -f "$LISTOPS_DIR.pid" ] && kill -0 "$(cat "$LISTOPS_DIR.pid")" 2>/dev/null && return 0
  mkdir -p "$LISTOPS_DIR"
  note "data: generating ListOps into $LISTOPS_DIR in the background (log: $STATE/data.log)"
  # shellcheck disable=SC2016 # expanded by the inner shell, from its arguments
  setsid bash -c 'if JAX_PLATFORMS=cpu "$0" -m lra_flax.data_cli listops --output_dir="$1" "${@:3}" >"$2" 2>&1
    then touch "$1.done"; fi; rm -f "$1.pid"' "$PY" "$LISTOPS_DIR" "$STATE/data.log" "${DATA_SIZES[@]}" &
  echo $! >"$LISTOPS_DIR.pid"
}

wait_data() {
  local waited=0
  while [ ! -f "$LISTOPS_DIR.done" ]; do
    if [ ! -f "$LISTOPS_DIR.pid" ]; then
      echo "data: generation failed; $STATE/data.log:" && tail -5 "$STATE/data.log"
      return 1
    fi
    if [ "$waited" -ge "${DATA_WAIT:-900}" ]; then
      echo "data: not ready after ${waited}s"
      return 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
}

step_info() {
  note info
  {
    echo "commit $COMMIT, platform $PLATFORM, dry run $DRY_RUN"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    command -v nvcc >/dev/null && nvcc --version | tail -2
    command -v ptxas >/dev/null && ptxas --version | tail -1
    "$PY" -c "import sys, jax, jaxlib, flax, optax; print('python', sys.version.split()[0], 'jax', jax.__version__,
'jaxlib', jaxlib.__version__, 'flax', flax.__version__, 'optax', optax.__version__); print(jax.devices())"
    "$PY" -m kernels
  } 2>&1 | tee "$OUT/info.txt"
}

workers_for() { # pytest workers for one test file: 4 for WIDE_FILES, else WORKERS
  case " ${WIDE_FILES:-} " in *" $(basename "$1") "*) echo 4 ;; *) echo "$WORKERS" ;; esac
}

step_kernel_tests() {
  note "kernel-tests: $(echo "$KERNEL_TESTS" | wc -w) files side by side, ${FILE_LIMIT}s each"
  mkdir -p "$OUT/junit"
  export PYTEST_FAILURES_FILE=$OUT/failures.txt
  : >"$PYTEST_FAILURES_FILE"
  local pids=() f
  for f in $KERNEL_TESTS; do
    local stem
    stem=$(basename "$f" .py)
    rm -f "$OUT/junit/$stem".*
    (
      start=$SECONDS
      limited "$FILE_LIMIT" "$OUT/junit/$stem.log" "$PY" -m pytest "$f" -p tests.failure_report -p no:cacheprovider \
        -n "$(workers_for "$f")" -v -rfE --tb=long --timeout="$TEST_LIMIT" --timeout-method=thread \
        --junitxml="$OUT/junit/$stem.xml" "${KERNEL_SELECT[@]}" "${pytest_args[@]}"
      rc=$?
      if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "killed at the file's limit of ${FILE_LIMIT}s (exit $rc)" >"$OUT/junit/$stem.timeout"
        rm -f "$OUT/junit/$stem.xml"
        printf '=== TIMEOUT %s: killed at the limit of %ss; last lines:\n%s\n\n' "$f" "$FILE_LIMIT" \
          "$(tail -5 "$OUT/junit/$stem.log")" >>"$PYTEST_FAILURES_FILE"
      elif [ $rc -ne 0 ] && [ $rc -ne 1 ]; then # no verdict per test: interrupted, an internal or usage error, no
        # tests collected, or workers that died at start (an abort inside XLA or the driver) — its log's own words
        printf '=== EXIT %s %s: pytest ended without a result for every test; last lines:\n%s\n' "$rc" "$f" \
          "$(log_words "$OUT/junit/$stem.log" | tail -12)" >>"$PYTEST_FAILURES_FILE"
        if grep -q "node down" "$OUT/junit/$stem.log"; then # a worker died: its last words are lost with it, so
          # the file runs again in one process without output capture, where an abort's message reaches the log
          limited 90 "$OUT/junit/$stem.serial.log" "$PY" -m pytest "$f" -p no:cacheprovider -n 0 -x -q -s \
            --timeout="$TEST_LIMIT" "${KERNEL_SELECT[@]}" "${pytest_args[@]}"
          printf -- '--- the same file in one process (-n 0 -x -s): exit %s; its log without stack frames:\n%s\n' \
            "$?" "$(log_words -e '^  File ' "$OUT/junit/$stem.serial.log" | head -25)" >>"$PYTEST_FAILURES_FILE"
        fi
        echo >>"$PYTEST_FAILURES_FILE"
      fi
      echo "$f: exit $rc in $((SECONDS - start))s; $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped)' \
        "$OUT/junit/$stem.log" | tail -1)"
    ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  "$PY" benchmarks/gpu/summarise_tests.py "$OUT/junit" "$OUT/kernel_tests.json"
  echo "failures: $(grep -c '^=== ' "$PYTEST_FAILURES_FILE") (full reports in $OUT/failures.txt); first lines:"
  grep -E '^(=== |E  )' "$PYTEST_FAILURES_FILE" | head -30 | cut -c1-240
}

step_probe() {
  local m
  for m in $MIXERS; do
    note "probe $m"
    limited 240 "$OUT/probe-$m.log" "$PY" -m lra_flax.efficiency --config=lra_flax/configs/listops.py:lra_code \
      --config.model.mixer="$m" "${LISTOPS_TOY[@]}" "${probe_args[@]}" --steps=10 --output="$OUT/probe-$m.json"
    echo "exit $?: $(tr -d '\n' <"$OUT/probe-$m.json" 2>/dev/null | cut -c1-300)"
  done
}

step_train() {
  start_data
  wait_data || return 1
  note "train: ${MIXERS} side by side, ${TRAIN_LIMIT}s"
  local pids=() m fault_env=()
  if [ -n "${TRAIN_FAULT:-}" ]; then
    fault_env=(ZOO_FAULT="$TRAIN_FAULT" PYTHONPATH="$PWD/tests/fault_injection:$PYTHONPATH")
  fi
  for m in $MIXERS; do
    (
      env "${fault_env[@]}" timeout -s TERM -k 90 "$TRAIN_LIMIT" "$PY" -m lra_flax.main \
        --config=lra_flax/configs/listops.py:lra_code --workdir="$STATE/listops-$m" --config.model.mixer="$m" \
        --config.data.dir="$LISTOPS_DIR" "${LISTOPS_TOY[@]}" "${train_args[@]}" >>"$STATE/listops-$m.log" 2>&1
      rc=$?
      case $rc in
        0) state=finished ;;
        75 | 124) state="stopped at the limit with a checkpoint: the next call resumes" ;;
        *) state="FAILED (exit $rc)" ;;
      esac
      echo "train $m: $state; $(grep -c '"split": "train"' "$STATE/listops-$m/metrics.jsonl" 2>/dev/null) train rows"
    ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for m in $MIXERS; do
    mkdir -p "$OUT/train/listops-$m"
    cp "$STATE/listops-$m.log" "$OUT/train/listops-$m/train.log" 2>/dev/null
    for f in config.json metrics.jsonl results.json; do
      cp "$STATE/listops-$m/$f" "$OUT/train/listops-$m/" 2>/dev/null
    done
    tail -2 "$STATE/listops-$m/metrics.jsonl" 2>/dev/null | cut -c1-240
    [ -f "$STATE/listops-$m/results.json" ] && tr -d '\n' <"$STATE/listops-$m/results.json" | cut -c1-300 && echo
  done
}

step_bench() {
  note bench
  limited "$BENCH_LIMIT" "$OUT/bench.log" "$PY" -m kernels.bench --out="$OUT/bench" "${BENCH_SIZES[@]}" \
    "${bench_args[@]}"
  echo "exit $?"
  grep -E "^\[" "$OUT/bench.log" | cut -c1-200 | tail -40
}

step_studies() {
  if [ -z "$STUDIES" ]; then
    echo "studies: name them in STUDIES (one or two a call; benchmarks/gpu/README.md gives the order)"
    return 1
  fi
  local name rc left deadline=$((SECONDS + STUDY_LIMIT))
  for name in $STUDIES; do
    left=$((deadline - SECONDS))
    if [ "$left" -lt 60 ]; then
      echo "studies: $name not started (${left}s left of ${STUDY_LIMIT}s); name it in the next call"
      continue
    fi
    note "studies: $name $STUDY_PRESET, at most ${left}s"
    mkdir -p "$OUT/studies/$name"
    # SIGTERM at the limit: the run in progress saves a checkpoint (SIGKILL 30 s later if it has not stopped).
    timeout -s TERM -k 30 "$left" "$PY" -m "studies.$name" "$STUDY_PRESET" --out="$OUT/studies/$name" \
      >"$OUT/studies/$name/study.log" 2>&1
    rc=$?
    case $rc in
      0) tail -1 "$OUT/studies/$name/study.log" ;;
      124 | 137)
        echo "$name: stopped at the limit (exit $rc); a study with training runs resumes them on the next call," \
          "the others start again"
        return 0
        ;;
      *) echo "$name: FAILED (exit $rc):" && tail -5 "$OUT/studies/$name/study.log" ;;
    esac
  done
}

step_pack() {
  note pack
  copy_data_log
  PACKED=1
  # Written beside what it packs, and only then the rest removed: a failed archive leaves every file in place. The
  # bench's results stay beside it too, moved up out of bench/.
  tar -czf "$STATE/session.tar.gz" -C "$OUT" . && mv "$STATE/session.tar.gz" "$OUT/" || return 1
  mv "$OUT"/bench/kernels-*.json "$OUT"/ 2>/dev/null
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name session.tar.gz ! -name info.txt ! -name failures.txt \
    ! -name kernel_tests.json ! -name 'kernels-*.json' -exec rm -rf {} +
  [ "$(find "$OUT" -type f | wc -l)" -le 8 ] || echo "pack: more than 8 files under $OUT; some will not come back"
  ls -la "$OUT"
}

case " $* " in *" train "*) start_data ;; esac # data first: it runs on the CPU while the GPU steps run
for s in "$@"; do
  case $s in
    info) step_info ;;
    data) start_data ;;
    kernel-tests) step_kernel_tests ;;
    probe) step_probe ;;
    train) step_train ;;
    bench) step_bench ;;
    studies) step_studies ;;
    pack) step_pack ;;
  esac
done
[ -z "${PACKED:-}" ] && copy_data_log
echo "=== done ($(date +%T)); results under $OUT"
