#!/usr/bin/env bash
# hpctrain on a workstation: plain mpiexec, resuming from the newest checkpoint. After a checkpoint on a signal (kill
# -USR1 on a rank) it exits with status 75; running the same command again continues where it stopped.
#
#   RANKS=4 jobscripts/local.sh deck.toml [hpctrain train options...]
#
# hpctrain: $HPCTRAIN, else the one on PATH, else this repository's build (build/release/bin/hpctrain).
set -o pipefail
deck=${1:-}
[[ -n $deck ]] || { echo "usage: [RANKS=N] jobscripts/local.sh DECK.toml [hpctrain train options...]" >&2; exit 2; }
shift
# The repository as the path to this script names it (not through links: a copy of the layout finds its own build).
repository=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
hpctrain=${HPCTRAIN:-$(command -v hpctrain || echo "$repository/build/release/bin/hpctrain")}
[[ -x $hpctrain ]] || {
  echo "local.sh: hpctrain not found: build it (cmake --preset release && cmake --build --preset release), set" \
    "HPCTRAIN=/path/to/hpctrain, or install it onto PATH (cmake --install build/release --prefix ~/.local)" >&2
  exit 2
}
status_file=${HPCTRAIN_STATUS_FILE:-${TMPDIR:-/tmp}/hpctrain-local-$$.status}
# Open MPI: -q leaves out mpiexec's own banner after a rank's non-zero exit (hpctrain has said what happened).
default_flags="--bind-to none"
mpiexec --version 2>/dev/null | grep -q "Open MPI" && default_flags="-q $default_flags"
read -r -a mpiexec_flags <<<"${HPCTRAIN_MPIEXEC_FLAGS:-$default_flags}"
launch_line=(mpiexec -n "${RANKS:-2}" "${mpiexec_flags[@]}" "$hpctrain" train "$deck" --resume auto "$@"
  --status-file "$status_file")
if [[ ${HPCTRAIN_DRY_RUN:-0} == 1 ]]; then printf 'launch:'; printf ' %q' "${launch_line[@]}"; printf '\n'; exit 0; fi
# Open MPI's mpiexec kills the ranks ~2 s after forwarding a SIGTERM: give a long step and its checkpoint a minute.
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-60}
"${launch_line[@]}"
status=$?
# What hpctrain recorded decides: mpiexec that got a signal (Ctrl-C, kill) may exit 1 although hpctrain checkpointed.
state="" && read -r state code _ 2>/dev/null <"$status_file" && rm -f "$status_file"
[[ $state == checkpointed || $state == complete ]] && status=$code
((status == 75)) && echo "local.sh: checkpointed; run the same command again to continue" >&2
exit "$status"
