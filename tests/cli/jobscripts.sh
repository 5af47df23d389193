#!/usr/bin/env bash
# The job scripts: every one is valid bash; each renders the launch line a 2-node job needs on the CPU and on GPUs
# (dry run: HPCTRAIN_DRY_RUN=1 prints the launch command and the requeue/resubmit command instead of running them).
# Then each runs for real against stand-in schedulers and a stand-in launcher that exits 1 after hpctrain checkpointed
# and exited 75 (what mpiexec does when it got a signal): every script goes by hpctrain's status file and requeues or
# resubmits, PBS and Flux with the job's own resources and an absolute script path. slurm.sh runs a real Slurm.
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
  grep -qE -- "$pattern" <<<"$output" && pass "$name: $(grep -E -- "$pattern" <<<"$output" | head -1)" ||
    fail "$name: '$output' lacks '$pattern'"
}
slurm=(env SLURM_NTASKS=8 SLURM_JOB_NUM_NODES=2 SLURM_CPUS_PER_TASK=8)
expect_line slurm "^launch: srun --ntasks=8 --ntasks-per-node=4 --cpus-per-task=8 .* train deck.toml --resume auto --output runs/x --status-file /" \
  "${slurm[@]}" bash "$scripts/slurm.sbatch" deck.toml --output runs/x
expect_line slurm-gpu "^launch: srun .* train deck.toml --resume auto --set run.device=cuda --output runs/x" \
  "${slurm[@]}" SLURM_GPUS_ON_NODE=4 bash "$scripts/slurm.sbatch" deck.toml --output runs/x
expect_line slurm-mpiexec "^launch: mpiexec -n 8 --map-by ppr:4:node:PE=8 " \
  "${slurm[@]}" HPCTRAIN_LAUNCHER=mpiexec bash "$scripts/slurm.sbatch" deck.toml
printf 'node1\nnode1\nnode1\nnode1\nnode2\nnode2\nnode2\nnode2\n' >nodefile
pbs=(env -u OMP_NUM_THREADS NCPUS=32 PBS_NODEFILE=nodefile HPCTRAIN_DECK=deck.toml)
expect_line pbs "^launch: mpiexec -n 8 --map-by ppr:4:node:PE=8 .* train deck.toml --resume auto --set train.time_limit=03:50:00 --status-file" \
  "${pbs[@]}" HPCTRAIN_WALLTIME=04:00:00 bash "$scripts/pbs.qsub"
expect_line pbs-args "train deck.toml --resume auto --output runs/p --set train.steps=5 --status-file" \
  "${pbs[@]}" HPCTRAIN_ARGS="--output runs/p --set train.steps=5" bash "$scripts/pbs.qsub"
expect_line lsf-jsrun "^launch: jsrun --nrs 8 --tasks_per_rs 1 --cpu_per_rs 1 .* train deck.toml --resume auto --status-file" \
  env HPCTRAIN_NODES=2 HPCTRAIN_DECK=deck.toml bash "$scripts/lsf.bsub"
expect_line lsf-gpu "^launch: jsrun --nrs 8 --tasks_per_rs 1 --gpu_per_rs 1 .* --resume auto --set run.device=cuda --output runs/l" \
  env HPCTRAIN_NODES=2 HPCTRAIN_DEVICE=cuda HPCTRAIN_DECK=deck.toml HPCTRAIN_ARGS="--output runs/l" bash "$scripts/lsf.bsub"
expect_line lsf-mpirun "^launch: mpirun -n 8 --map-by ppr:4:node:PE=1 " \
  env HPCTRAIN_NODES=2 HPCTRAIN_LAUNCHER=mpirun HPCTRAIN_DECK=deck.toml bash "$scripts/lsf.bsub"
expect_line flux "^launch: flux run -N 2 -n 8 -c 1 [^ ]*hpctrain train deck.toml --resume auto --output runs/f" \
  env HPCTRAIN_NODES=2 bash "$scripts/flux.sh" deck.toml --output runs/f
expect_line flux-gpu "^launch: flux run -N 2 -n 8 -c 1 -g 1 .* --resume auto --set run.device=cuda" \
  env HPCTRAIN_NODES=2 HPCTRAIN_DEVICE=cuda bash "$scripts/flux.sh" deck.toml
expect_line local "^launch: mpiexec -n 3 --bind-to none .* train deck.toml --resume auto" \
  env RANKS=3 bash "$scripts/local.sh" deck.toml

# ---- for real, against stand-ins ----
unset HPCTRAIN_DRY_RUN
read -r -a mpiexec_line <<<"$MPIEXEC"
mpiexec_line[0]=$(command -v "${mpiexec_line[0]}")  # before the stand-in mpiexec comes first on PATH
export STANDIN_MPIEXEC="${mpiexec_line[*]}" LOG=$WORK/schedulers.log
mkdir -p bin submit/jobs
# The launcher: hpctrain's part of the launch line on one rank, then exit status 1 whatever hpctrain's was.
cat >bin/launcher <<'SH'
#!/usr/bin/env bash
while [[ $# -gt 0 && $1 != "$HPCTRAIN" ]]; do shift; done
$STANDIN_MPIEXEC -n 1 "$@" >>"$LOG.hpctrain" 2>&1
echo "hpctrain exited with $?, the launcher with 1" >>"$LOG"
exit 1
SH
for name in srun mpiexec mpirun jsrun; do ln -s launcher bin/$name; done
for name in scontrol brequeue; do printf '#!/usr/bin/env bash\necho "%s $*" >>"$LOG"\n' $name >bin/$name; done
printf '#!/usr/bin/env bash\necho "in $PWD: qsub $*" >>"$LOG"\n' >bin/qsub
# qstat -f of a PBS Pro job (long values continue on a line that starts with a tab).
cat >bin/qstat <<'SH'
#!/usr/bin/env bash
printf 'Job Id: %s\n    Resource_List.select = 1:ncpus=2:mpiprocs=1\n    Resource_List.walltime = 00:01:00\n' "$2"
printf '    Submit_arguments = -l select=1:ncpus=2:mpiprocs=1 -l walltime=00:01:00 -v HPCTRAIN_DECK=deck.toml,HPCTRAIN_A\n'
printf '\tRGS=--output run-pbs jobs/pbs.qsub\n'
SH
cat >bin/flux <<'SH'
#!/usr/bin/env bash
[[ $1 == --parent ]] && shift
case "$1 $2" in
  "run "*) exec env -u FLUX_JOB_ID launcher "$@" ;;  # OpenMPI's mpiexec crashes trying Flux's PMI when it is set
  "resource list") case $4 in {nnodes} | {ncores}) echo 1 ;; *) echo 0 ;; esac ;;
  "job info") echo '{"attributes": {"system": {"duration": 43200.0, "cwd": "/x"}}, "version": 1}' ;;
  "batch "*) echo "in $PWD: flux --parent $*" >>"$LOG" ;;
  *) echo "flux $*" >>"$LOG" ;;
esac
SH
chmod +x bin/*
cp "$scripts/pbs.qsub" "$scripts/flux.sh" submit/jobs/  # submitted by a path relative to submit/
make_spirals submit/train.h5 600 1
cat >submit/deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 1000000
time_limit = "00:00:10"
TOML
# Each step is 1 s of hpctrain's clock: the run checkpoints and stops at step 6 with status 75 (training_loop.sh).
export HPCTRAIN_TEST_SECONDS_PER_STEP=1 PATH=$WORK/bin:$PATH HPCTRAIN_RANKS_PER_NODE=1 HPCTRAIN_NODES=1
expect_run() {  # expect_run NAME EXIT_STATUS PATTERN COMMAND...: the script's exit status and a line of its log
  local name=$1 expected=$2 pattern=$3 status=0; shift 3
  : >"$LOG"
  (cd submit && "$@") >"$name.out" 2>&1 || status=$?
  if ((status == expected)) && grep -qE -- "$pattern" "$LOG"; then
    pass "$name: exit $status; $(grep -E -- "$pattern" "$LOG")"
  else
    fail "$name: exit $status (expected $expected), log lacks '$pattern'"
    cat "$name.out" "$LOG" "$LOG.hpctrain" >&2
  fi
}
checkpointed="hpctrain exited with 75, the launcher with 1"
expect_run slurm-requeue 0 "^scontrol requeue 11$" env SLURM_JOB_ID=11 bash "$scripts/slurm.sbatch" deck.toml --output run-slurm
grep -q "$checkpointed" "$LOG" && pass "slurm: requeued on hpctrain's status, not the launcher's" || fail "slurm: $(cat "$LOG")"
expect_run slurm-failed 1 "hpctrain exited with 2" env SLURM_JOB_ID=12 bash "$scripts/slurm.sbatch" deck.toml --set train.steps=-1
grep -q "requeue" "$LOG" && fail "slurm: a failed run was requeued" || pass "slurm: a failed run is not requeued"
expect_run pbs-resubmit 0 "^in $WORK/submit: qsub -l select=1:ncpus=2:mpiprocs=1 -l walltime=00:01:00 -v HPCTRAIN_DECK=deck.toml,HPCTRAIN_ARGS=--output run-pbs jobs/pbs.qsub$" \
  env PBS_JOBID=7.pbs PBS_O_WORKDIR="$WORK/submit" HPCTRAIN_DECK=deck.toml HPCTRAIN_ARGS="--output run-pbs" bash jobs/pbs.qsub
expect_run lsf-requeue 0 "^brequeue 21$" env LSB_JOBID=21 HPCTRAIN_DECK=deck.toml HPCTRAIN_ARGS="--output run-lsf" \
  bash "$scripts/lsf.bsub"
expect_run flux-resubmit 0 "^in $WORK/submit: flux --parent batch -N 1 -t 43200s $WORK/submit/jobs/flux.sh deck.toml --output run-flux$" \
  env FLUX_JOB_ID=f42 bash jobs/flux.sh deck.toml --output run-flux
expect_run local-75 75 "$checkpointed" env RANKS=1 bash "$scripts/local.sh" deck.toml --output run-local
for run in slurm pbs lsf flux local; do
  [[ $(cat "submit/run-$run/status" 2>/dev/null) == "checkpointed 75 step 6" ]] || fail "submit/run-$run/status"
done
ls submit/.hpctrain-* 2>/dev/null && fail "status files left in the submit directory" || pass "status files read and removed"
finish
