#!/usr/bin/env bash
# A Cloud TPU VM slice: create (or reuse) it, install the project on every worker, run the same command
# on all workers, and collect their logs.
#
#   launch/tpu_pod.sh --name NAME --zone ZONE [--accelerator-type v5litepod-16] [--version tpu-ubuntu2204-base]
#                     [--project P] [--spot] [--skip-create] [--skip-install] [--logs DIR] [--workers N] [--dry-run] -- \
#       lra-train --config=lra_flax/configs/listops.py:lra_code --workdir=gs://bucket/runs/listops
#
# Every worker runs the command from ~/zoo/.venv; JAX finds the other workers itself (Cloud TPU), so the
# command needs no distributed flags. Logs land in DIR/worker-<i>.log (default: tpu-logs/NAME); the
# number of workers (hosts) comes from gcloud, or --workers.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/common.sh
source "$here/common.sh"

name="" zone="" accel="v5litepod-16" version="tpu-ubuntu2204-base" project="" spot=0
skip_create=0 skip_install=0 logs="" workers=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) [[ $# -ge 2 ]] || die "--name needs a value"; name="$2"; shift 2 ;;
    --zone) [[ $# -ge 2 ]] || die "--zone needs a value"; zone="$2"; shift 2 ;;
    --accelerator-type) [[ $# -ge 2 ]] || die "--accelerator-type needs a value"; accel="$2"; shift 2 ;;
    --version) [[ $# -ge 2 ]] || die "--version needs a value"; version="$2"; shift 2 ;;
    --project) [[ $# -ge 2 ]] || die "--project needs a value"; project="$2"; shift 2 ;;
    --logs) [[ $# -ge 2 ]] || die "--logs needs a value"; logs="$2"; shift 2 ;;
    --workers) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--workers needs a positive number"; workers="$2"; shift 2 ;;
    --spot) spot=1; shift ;;
    --skip-create) skip_create=1; shift ;;
    --skip-install) skip_install=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the command goes after --)" ;;
  esac
done
[[ -n "$name" ]] || die "--name is required"
[[ -n "$zone" ]] || die "--zone is required"
[[ $# -gt 0 ]] || die "no command given; put it after --"
[[ "$name" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || die "--name must be lower-case letters, digits and '-' (got '$name')"
export DRY_RUN="${DRY_RUN:-0}"
logs="${logs:-tpu-logs/$name}"
if [[ "$DRY_RUN" != "1" ]]; then
  command -v gcloud >/dev/null || die "gcloud not found; install the Google Cloud CLI and log in"
fi

gc=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
[[ -n "$project" ]] && where+=(--project="$project")

# 1. Create the slice unless it exists (or --skip-create).
if [[ "$skip_create" == "0" ]]; then
  if [[ "$DRY_RUN" != "1" ]] && "${gc[@]}" describe "$name" "${where[@]}" >/dev/null 2>&1; then
    echo "TPU VM '$name' exists; reusing it"
  else
    create=("${gc[@]}" create "$name" "${where[@]}" --accelerator-type="$accel" --version="$version")
    [[ "$spot" == "1" ]] && create+=(--spot)
    run "${create[@]}"
  fi
fi

# 2. Install this checkout on every worker: a tarball of the tracked files, then a venv with the [tpu] extra.
if [[ "$skip_install" == "0" ]]; then
  tarball="${TMPDIR:-/tmp}/zoo-$name.tar.gz"
  run git -C "$here/.." archive --format=tar.gz -o "$tarball" HEAD
  run "${gc[@]}" scp "$tarball" "$name:~/zoo.tar.gz" "${where[@]}" --worker=all
  install='rm -rf ~/zoo && mkdir -p ~/zoo && tar -xzf ~/zoo.tar.gz -C ~/zoo && cd ~/zoo'
  install+=' && python3 -m venv .venv && .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q -e ".[tpu]"'
  run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command="$install"
fi

# 3. The same command on every worker; each worker's output to its own log file there.
remote="cd ~/zoo && export PATH=\$HOME/zoo/.venv/bin:\$PATH && ($(join_quoted "$@")) 2>&1 | tee ~/zoo/train.log"
status=0
run "${gc[@]}" ssh "$name" "${where[@]}" --worker=all --command="$remote" || status=$?

# 4. Collect the logs, whatever the outcome.
run mkdir -p "$logs"
# The accelerator suffix counts chips or cores, not hosts: ask gcloud how many workers the slice has.
if [[ -z "$workers" ]]; then
  workers=1
  if [[ "$DRY_RUN" != "1" ]]; then
    workers="$("${gc[@]}" describe "$name" "${where[@]}" --format='value(networkEndpoints.len())' 2>/dev/null || echo 1)"
  fi
fi
for ((i = 0; i < workers; i++)); do
  run "${gc[@]}" scp "$name:~/zoo/train.log" "$logs/worker-$i.log" "${where[@]}" --worker="$i" || true
done
exit "$status"
