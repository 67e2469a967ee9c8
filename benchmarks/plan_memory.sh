#!/bin/bash
# Every --plan_memory figure in docs/ (results.md, scaling.md): one file per case, its command on the first line.
#   benchmarks/plan_memory.sh [OUT_DIR]    (default benchmarks/plan-memory-cpu; ~10 minutes on 2 CPU cores)
set -u
cd "$(dirname "$0")/.."
out=${1:-benchmarks/plan-memory-cpu}
mkdir -p "$out"
{
  echo "$(date -u +%F) (UTC), commit $(git rev-parse --short HEAD)"
  .venv/bin/python -c 'import jax, platform; print("jax", jax.__version__, "on", jax.devices()[0].device_kind, platform.machine())'
  echo "$(nproc) CPU cores; command: benchmarks/plan_memory.sh"
} > "$out/machine.txt"
run() {
  local name=$1; shift
  echo "lra-train $* --plan_memory" > "$out/$name.txt"
  .venv/bin/lra-train "$@" --plan_memory 2>&1 | grep -v "^W[0-9]" >> "$out/$name.txt"
}
for m in softmax relu linear; do
  run retrieval-$m --config=lra_flax/configs/retrieval.py:lra_code --config.model.mixer=$m
  run pathx-$m --config=lra_flax/configs/pathfinder.py:pathx --config.model.mixer=$m
done
run listops-fsdp8 --config=lra_flax/configs/listops.py:lra_code --fake_cpu_devices=8 --config.mesh.data=1 --config.mesh.fsdp=8
run listops-2x2x2 --config=lra_flax/configs/listops.py:lra_code --fake_cpu_devices=8 --config.mesh.data=2 \
  --config.mesh.fsdp=2 --config.mesh.tensor=2
for t in listops text; do
  c=lra_flax/configs/$t.py:lra_code
  run $t-plain --config=$c --config.model.mixer=relu
  run $t-remat_full --config=$c --config.model.mixer=relu --config.model.remat=full
  run $t-remat_dots --config=$c --config.model.mixer=relu --config.model.remat=dots
  run $t-scan --config=$c --config.model.mixer=relu --config.model.scan_layers=True
  run $t-scan_remat_full --config=$c --config.model.mixer=relu --config.model.scan_layers=True --config.model.remat=full
  run $t-bf16 --config=$c --config.model.mixer=relu --config.model.dtype=bfloat16
  run $t-bf16_scan_remat_full --config=$c --config.model.mixer=relu --config.model.dtype=bfloat16 \
    --config.model.scan_layers=True --config.model.remat=full
done
