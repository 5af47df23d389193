#!/usr/bin/env bash
# hpctrain under Flux, on the CPU or on GPUs, resuming from the newest checkpoint.
#
#   flux batch jobscripts/flux.sh deck.toml [hpctrain train options...]
#   flux batch -N 4 -t 12h jobscripts/flux.sh deck.toml --output runs/big
#
# Ranks per node: HPCTRAIN_RANKS_PER_NODE (default 4), each with the node's cores divided among them. An allocation
# with GPUs trains on them, one rank per GPU (flux run -g 1) with --set run.device=cuda (HPCTRAIN_DEVICE=cpu|cuda
# overrides). Walltime: `--signal=USR1@5m` (flux-core >= 0.49) sends SIGUSR1 5 minutes before the limit; hpctrain
# writes a checkpoint, records "checkpointed" in its status file and exits with status 75, and the script submits
# itself again to the enclosing instance with the same nodes and time limit (flux --parent batch). On an older Flux,
# pass --set train.time_limit=HH:MM:SS (a little under -t) instead. See docs/jobscripts.md.
#FLUX: --job-name=hpctrain
#FLUX: -N 1
#FLUX: -t 4h
#FLUX: --output=hpctrain-{{id}}.out
#FLUX: --signal=USR1@5m
# Your site's queue and bank (flux queue list): delete one '#' to enable a line.
##FLUX: --queue=QUEUE
##FLUX: --bank=PROJECT

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
[[ -x $hpctrain ]] || {
  echo "flux.sh: hpctrain not found: load its module, set HPCTRAIN, or install it onto PATH (cmake --install)" >&2
  exit 2
}
# This allocation (this job's Flux instance): nodes, cores and GPUs.
resources() { flux resource list -no "{$1}" 2>/dev/null | grep -E '^[0-9]+$' || echo 0; }
nodes=${HPCTRAIN_NODES:-$(resources nnodes)}
((nodes > 0)) || nodes=1
ranks_per_node=${HPCTRAIN_RANKS_PER_NODE:-${HPCTRAIN_GPUS_PER_NODE:-4}}
ranks=$((nodes * ranks_per_node))
cores=$(resources ncores)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores >= ranks ? cores / ranks : 1))}
device=${HPCTRAIN_DEVICE:-cpu}
[[ -z ${HPCTRAIN_DEVICE:-} ]] && (($(resources ngpus) > 0)) && device=cuda
device_options=(-c "$OMP_NUM_THREADS")
[[ $device == cuda ]] && device_options+=(-g 1)
job_id=${FLUX_JOB_ID:-$(flux getattr jobid 2>/dev/null)}
status_file=${HPCTRAIN_STATUS_FILE:-$PWD/.hpctrain-${job_id:-$$}.status}
launch_line=(flux run -N "$nodes" -n "$ranks" "${device_options[@]}" "$hpctrain" train "$deck" --resume auto)
[[ $device == cuda ]] && launch_line+=(--set run.device=cuda)
launch_line+=("$@" --status-file "$status_file")

# Resubmission to the enclosing instance (this job's instance ends with it): this script by absolute path (flux runs
# a copy of it; HPCTRAIN_JOBSCRIPT names another), with the job's node count and time limit.
script=$(realpath "${HPCTRAIN_JOBSCRIPT:-$0}")
duration=$(flux --parent job info "${job_id:-0}" jobspec 2>/dev/null | sed -n 's/.*"duration": *\([0-9.]*\).*/\1/p')
resubmit=(flux --parent batch -N "$nodes" ${duration:+-t "${duration%.*}s"} "$script" "$deck" "$@")
if [[ ${HPCTRAIN_DRY_RUN:-0} == 1 ]]; then
  printf 'launch:'; printf ' %q' "${launch_line[@]}"
  printf '\nwhen checkpointed (status file or exit 75):'; printf ' %q' "${resubmit[@]}"; printf '\n'
  exit 0
fi
rm -f "$status_file"
trap 'flux job kill --signal=USR1 "$(flux job last)" 2>/dev/null' USR1  # forward the warning to the job step
"${launch_line[@]}" &
step=$!
wait "$step"; status=$?
((status > 128)) && { wait "$step"; status=$?; }
# What hpctrain recorded decides: a launcher that got a signal may exit 1 although hpctrain checkpointed.
state="" && read -r state code _ 2>/dev/null <"$status_file" && rm -f "$status_file"
[[ $state == checkpointed || $state == complete ]] && ((code != status)) &&
  echo "flux.sh: hpctrain recorded '$state' (status $code): going by that" && status=$code
((status == 75)) && "${resubmit[@]}" && echo "flux.sh: checkpointed; resubmitted: ${resubmit[*]}" && exit 0
exit "$status"
