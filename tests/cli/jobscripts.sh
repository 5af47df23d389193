#!/usr/bin/env bash
# The job scripts: every one is valid bash, and each renders the launch line a 2-node x 4-GPU job needs (dry run:
# HPCTRAIN_DRY_RUN=1 prints the launch command instead of running it). slurm.sbatch also runs for real in slurm.sh.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
scripts=$HPCTRAIN_SOURCE_DIR/jobscripts
for script in "$scripts"/*; do
  bash -n "$script" && pass "bash -n $(basename "$script")" || fail "syntax error in $script"
done
export HPCTRAIN HPCTRAIN_DRY_RUN=1
expect_line() {  # expect_line NAME PATTERN COMMAND...
  local name=$1 pattern=$2 output; shift 2
  output=$("$@" 2>&1) || { fail "$name: exit status $?: $output"; return; }
  grep -qE -- "$pattern" <<<"$output" && pass "$name: $(head -1 <<<"$output")" || fail "$name: '$output' lacks '$pattern'"
}
expect_line slurm "^launch: srun --ntasks=8 --ntasks-per-node=4 .* train deck.toml --resume auto --output runs/x" \
  env SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 bash "$scripts/slurm.sbatch" deck.toml --output runs/x
expect_line slurm-mpiexec "^launch: mpiexec -n 8 --map-by ppr:4:node " \
  env SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 HPCTRAIN_LAUNCHER=mpiexec bash "$scripts/slurm.sbatch" deck.toml
printf 'node1\nnode1\nnode1\nnode1\nnode2\nnode2\nnode2\nnode2\n' >nodefile
expect_line pbs "^launch: mpiexec -n 8 --map-by ppr:4:node .* train deck.toml --resume auto --set train.time_limit=03:50:00" \
  env PBS_NODEFILE=nodefile HPCTRAIN_WALLTIME=04:00:00 HPCTRAIN_DECK=deck.toml bash "$scripts/pbs.qsub"
expect_line lsf-jsrun "^launch: jsrun --nrs 8 --tasks_per_rs 1 --gpu_per_rs 1 .* train deck.toml --resume auto" \
  env HPCTRAIN_NODES=2 HPCTRAIN_DECK=deck.toml bash "$scripts/lsf.bsub"
expect_line lsf-mpirun "^launch: mpirun -n 8 --map-by ppr:4:node " \
  env HPCTRAIN_NODES=2 HPCTRAIN_LAUNCHER=mpirun HPCTRAIN_DECK=deck.toml bash "$scripts/lsf.bsub"
expect_line flux "^launch: flux run -N 2 -n 8 -g 1 .* train deck.toml --resume auto" \
  env HPCTRAIN_NODES=2 bash "$scripts/flux.sh" deck.toml
expect_line local "^launch: mpiexec -n 3 --bind-to none .* train deck.toml --resume auto" \
  env RANKS=3 bash "$scripts/local.sh" deck.toml
finish
