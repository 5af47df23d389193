#!/usr/bin/env bash
# hpctrain under Flux: one rank per GPU, resuming from the newest checkpoint.
#
#   flux batch jobscripts/flux.sh deck.toml
#   flux batch -N 4 -t 12h jobscripts/flux.sh deck.toml
#
# Walltime: `--signal=USR1@5m` (flux-core >= 0.49) sends SIGUSR1 5 minutes before the limit; hpctrain writes a
# checkpoint and exits with status 75, and the script submits itself again. On an older Flux, pass
# --set train.time_limit=HH:MM:SS (a little under -t) instead. See docs/checkpoints.md.
#FLUX: --job-name=hpctrain
#FLUX: -N 1
#FLUX: -t 4h
#FLUX: --output=hpctrain-{{id}}.out
#FLUX: --signal=USR1@5m

set -o pipefail
# ---------------------------------------------------------------------------------------------------------------------
# Site-specific environment: module load lines (the modules hpctrain was built with).
# module load gcc/12 openmpi/4.1 hdf5/1.10-parallel cuda/12
# ---------------------------------------------------------------------------------------------------------------------
# InfiniBand clusters (see slurm.sbatch for what each does):
# export NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME=ib0 UCX_TLS=rc,sm,self OMPI_MCA_pml=ucx

deck=${1:-${HPCTRAIN_DECK:-}}
[[ -n $deck ]] || { echo "usage: flux batch jobscripts/flux.sh DECK.toml [hpctrain train options...]" >&2; exit 2; }
shift
hpctrain=${HPCTRAIN:-$(command -v hpctrain || true)}
[[ -x $hpctrain ]] || { echo "flux.sh: hpctrain not found: load its module or set HPCTRAIN" >&2; exit 2; }
nodes=${HPCTRAIN_NODES:-$(flux resource list -no '{nnodes}' 2>/dev/null || echo 1)}
gpus_per_node=${HPCTRAIN_GPUS_PER_NODE:-4}
ranks=$((nodes * gpus_per_node))
launch_line=(flux run -N "$nodes" -n "$ranks" -g 1 "$hpctrain" train "$deck" --resume auto "$@")
if [[ ${HPCTRAIN_DRY_RUN:-0} == 1 ]]; then
  printf 'launch:'; printf ' %q' "${launch_line[@]}"; printf '\non exit 75: flux batch jobscripts/flux.sh %s\n' "$deck"
  exit 0
fi
trap 'flux job kill --signal=USR1 "$step" 2>/dev/null' USR1  # forward the warning to the job step
"${launch_line[@]}" &
step=$!
wait "$step"; status=$?
((status > 128)) && { wait "$step"; status=$?; }
((status == 75)) && flux batch "${HPCTRAIN_JOBSCRIPT:-jobscripts/flux.sh}" "$deck" "$@" && exit 0
exit "$status"
