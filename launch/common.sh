#!/usr/bin/env bash
# Helpers shared by the launch scripts (sourced, not run).

# run CMD...: print the command (shell-quoted); execute it unless DRY_RUN=1.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ "${DRY_RUN:-0}" != "1" ]]; then
    "$@"
  fi
}

# usage [STATUS]: print the script's header comment (the comment lines after the #! line), then exit.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit "${1:-2}"
}

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 2
}

# join_quoted ARGS...: one string with every argument shell-quoted (for remote shells).
join_quoted() {
  local out="" arg
  for arg in "$@"; do
    out+="$(printf '%q' "$arg") "
  done
  printf '%s' "${out% }"
}
