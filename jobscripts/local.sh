#!/usr/bin/env bash
# hpctrain on a workstation: plain mpiexec, resuming from the newest checkpoint. After a checkpoint on a signal (kill
# -USR1 on a rank) it exits with status 75; running the same command again continues where it stopped.
#
#   RANKS=4 jobscripts/local.sh deck.toml [hpctrain train options...]
set -o pipefail
deck=${1:-}
[[ -n $deck ]] || { echo "usage: [RANKS=N] jobscripts/local.sh DECK.toml [hpctrain train options...]" >&2; exit 2; }
shift
hpctrain=${HPCTRAIN:-$(command -v hpctrain || true)}
[[ -x $hpctrain ]] || { echo "local.sh: hpctrain not found: add it to PATH or set HPCTRAIN" >&2; exit 2; }
read -r -a mpiexec_flags <<<"${HPCTRAIN_MPIEXEC_FLAGS:---bind-to none}"
launch_line=(mpiexec -n "${RANKS:-2}" "${mpiexec_flags[@]}" "$hpctrain" train "$deck" --resume auto "$@")
if [[ ${HPCTRAIN_DRY_RUN:-0} == 1 ]]; then printf 'launch:'; printf ' %q' "${launch_line[@]}"; printf '\n'; exit 0; fi
"${launch_line[@]}"
exit $?
