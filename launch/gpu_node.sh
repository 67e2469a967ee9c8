#!/usr/bin/env bash
# One host, all its GPUs: one process drives every local GPU (the mesh spans them; no distributed start-up).
#
#   launch/gpu_node.sh [--dry-run] [--gpus 0,1,2,3] [--venv .venv] [--log FILE] -- \
#       lra-train --config=lra_flax/configs/listops.py:lra_code --workdir=runs/listops
#
# The command after `--` is a task CLI from the venv (lra-train, ...) or any command.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/common.sh
source "$here/common.sh"

gpus="" venv="$here/../.venv" log=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --gpus) [[ $# -ge 2 ]] || die "--gpus needs a value"; gpus="$2"; shift 2 ;;
    --venv) [[ $# -ge 2 ]] || die "--venv needs a value"; venv="$2"; shift 2 ;;
    --log) [[ $# -ge 2 ]] || die "--log needs a value"; log="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the command goes after --)" ;;
  esac
done
[[ $# -gt 0 ]] || die "no command given; put it after --"
[[ -z "$gpus" || "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus must look like 0,1,2,3 (got '$gpus')"

export DRY_RUN="${DRY_RUN:-0}"
if [[ -n "$gpus" ]]; then
  export CUDA_VISIBLE_DEVICES="$gpus"
  echo "+ export CUDA_VISIBLE_DEVICES=$gpus"
fi
# Let XLA overlap collectives with compute, and leave room for cuDNN/NCCL workspaces.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
echo "+ export XLA_FLAGS=\"$XLA_FLAGS\""

if [[ "$DRY_RUN" != "1" ]]; then
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: is this a GPU host with the NVIDIA driver?"
  [[ -x "$venv/bin/python" ]] || die "no virtual environment at $venv (make demo creates one; pip install -e '.[gpu]')"
fi
export PATH="$venv/bin:$PATH"
if [[ -n "$log" ]]; then
  run mkdir -p "$(dirname "$log")"
  echo "+ $(join_quoted "$@") 2>&1 | tee -a $(printf '%q' "$log")"
  if [[ "$DRY_RUN" != "1" ]]; then
    "$@" 2>&1 | tee -a "$log"
  fi
else
  run "$@"
fi
