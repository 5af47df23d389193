#!/usr/bin/env bash
# jobscripts/slurm.sbatch on a real Slurm: a private single-node cluster (munge, slurmctld, slurmd from Debian's
# packages, configured in a temporary directory) runs (1) a job that trains to the end and (2) a job that gets the
# walltime warning signal while training, checkpoints, requeues itself and finishes from its checkpoint with the same
# parameters as (1). (3) checks the mpiexec launcher inside the allocation, (4) that a job with GPUs (stand-ins) makes
# the script train on them. Needs root (SlurmUser=root); skips (77)
# where it cannot get Slurm running, unless HPCTRAIN_REQUIRE_SLURM=1 makes that a failure.
source "$(dirname "$0")/lib/common.bash"
script=$HPCTRAIN_SOURCE_DIR/jobscripts/slurm.sbatch
# Each line says when it happened (seconds since the test started), so that a failure on a slow machine shows which
# wait took the time.
pass() { echo "ok [+$SECONDS s]: $*"; }
fail() { echo "FAIL [+$SECONDS s]: $*" >&2; failures=$((failures + 1)); }

skip() {
  echo "SKIP: $*"
  if [[ ${HPCTRAIN_REQUIRE_SLURM:-0} == 1 ]]; then exit 1; fi
  exit 77
}

# --- Slurm and munge: installed from Debian packages when missing (quick no-op when present) ---
[[ $(id -u) -eq 0 ]] || skip "needs root: the test cluster runs slurmd as root and may install packages"
slurm_present() { command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged; } >/dev/null
if ! slurm_present; then
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get"
  echo "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  # The lock timeout: another apt-get (tools/install-deps.sh in a parallel test) may hold the lock.
  { apt-get -o DPkg::Lock::Timeout=300 update -q &&
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends slurm-wlm munge; } >"$WORK/apt.log" 2>&1 ||
    { tail -20 "$WORK/apt.log" >&2; skip "apt-get could not install slurm-wlm and munge"; }
  slurm_present || skip "slurm-wlm installed but its programs are missing"
fi

# --- a private cluster under $WORK/cluster: nothing outside it is touched ---
cluster=$WORK/cluster
mkdir -p "$cluster"/{state,spool,log,munge,tmp}
chmod 700 "$cluster/munge"
conf=$cluster/slurm.conf
export SLURM_CONF=$conf
munged_pid="" slurmctld_pid="" slurmd_pid="" watcher_pid=""

# Stops what this test started, by pid: jobs first (so their slurmstepd and ranks end), then the daemons.
stop_cluster() {
  local status=$?
  trap - EXIT
  if [[ -n $slurmctld_pid ]]; then
    scancel --quiet --user=root 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while [[ -n $(squeue -h -o %i 2>/dev/null) ]] && ((SECONDS < deadline)); do sleep 0.5; done
  fi
  local pid
  for pid in $watcher_pid $slurmd_pid $slurmctld_pid $munged_pid; do
    kill "$pid" 2>/dev/null || true
    timeout 15 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true
  done
  # A job that did not end in time leaves processes without their slurmstepd (the batch shell, srun, ranks): they
  # belong to this cluster when their environment names its slurm.conf and a job id.
  local environment
  for pid in $(pgrep -d ' ' -f 'slurmstepd|slurm_script|srun|hpctrain' || true); do
    environment=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) || continue
    if grep -qx "SLURM_CONF=$conf" <<<"$environment" &&
      { grep -q "^SLURM_JOB_ID=" <<<"$environment" || [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmstepd ]]; }; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  if ((status != 0)); then
    echo "--- slurmctld.log (tail)" >&2; tail -20 "$cluster/log/slurmctld.log" >&2 2>/dev/null || true
    echo "--- slurmd.log (tail)" >&2; tail -20 "$cluster/log/slurmd.log" >&2 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$status"
}
trap stop_cluster EXIT

# munge with its own key and socket, so that a system munged (if any) is neither needed nor disturbed.
dd if=/dev/urandom of="$cluster/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$cluster/munge/munge.key"
munge_socket=$cluster/munge/socket
# setsid: each daemon (and each job's tasks, which slurmstepd puts in sessions of their own) gets its own session and so,
# with the kernel's autogroup scheduling, its own fair CPU share: in a busy session (a parallel build, the rest of the
# test suite) the daemons and the watcher below would otherwise wait many seconds for a CPU while the ranks run.
setsid munged --foreground --force --socket="$munge_socket" --key-file="$cluster/munge/munge.key" \
  --log-file="$cluster/log/munged.log" --pid-file="$cluster/munge/munged.pid" --seed-file="$cluster/munge/seed" \
  >"$cluster/log/munged.out" 2>&1 &
munged_pid=$!
for _ in $(seq 50); do [[ -S $munge_socket ]] && break; sleep 0.1; done
[[ -S $munge_socket ]] || { cat "$cluster/log/munged.out" >&2; skip "munged did not start"; }

# Two free ports, so that this cluster does not collide with a system Slurm or a parallel run of this test.
read -r ctld_port slurmd_port < <($PYTHON -c '
import socket
sockets = [socket.socket() for _ in range(2)]
for s in sockets: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))')
node=$(hostname -s)
cpus=$(nproc)
((cpus >= 2)) || cpus=2 # two ranks; config_overrides lets slurmd believe the configuration
# Two stand-in GPUs (any character devices will do) so that a job can request GPUs as on a GPU cluster.
printf 'Name=gpu File=%s\n' /dev/null /dev/zero >"$cluster/gres.conf"
cat >"$conf" <<CONF
ClusterName=hpctraintest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$munge_socket,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
TmpFS=$cluster/tmp
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/log/slurmctld.log
SlurmdLogFile=$cluster/log/slurmd.log
ReturnToService=2
MinJobAge=600
KillWait=10
GresTypes=gpu
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
setsid slurmctld -D -f "$conf" >"$cluster/log/slurmctld.out" 2>&1 &
slurmctld_pid=$!
setsid slurmd -D -f "$conf" -N "$node" >"$cluster/log/slurmd.out" 2>&1 &
slurmd_pid=$!
deadline=$((SECONDS + 30))
until [[ $(sinfo -h -o %T 2>/dev/null) == idle ]]; do
  if ((SECONDS > deadline)); then
    cat "$cluster/log/slurmctld.out" "$cluster/log/slurmd.out" >&2
    sinfo -R >&2 || true
    skip "the test cluster did not come up (node state '$(sinfo -h -o %T 2>/dev/null)')"
  fi
  sleep 0.3
done
pass "single-node $(sbatch --version) up: node $node, $cpus CPUs, ports $ctld_port/$slurmd_port"

# --- helpers ---
# Every wait below is bounded, and all of them together too: the test ends (and stops its daemons) before CTest's
# timeout would kill it without cleaning up.
test_deadline=$((SECONDS + 420))  # CTest gives this test 600 s (tests/CMakeLists.txt)
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# wait_for JOB SECONDS CONDITION: until the shell condition (on $state, $restarts) holds; false on timeout or failure.
wait_for() {
  local job=$1 seconds=$2 condition=$3 deadline=$((SECONDS + $2))
  ((deadline < test_deadline)) || deadline=$test_deadline
  while ((SECONDS <= deadline)); do
    state=$(job_field "$job" JobState) restarts=$(job_field "$job" Restarts)
    eval "$condition" && return 0
    [[ $state =~ ^(FAILED|CANCELLED|TIMEOUT|NODE_FAIL|BOOT_FAIL|OUT_OF_MEMORY|DEADLINE)$ ]] && break
    sleep 0.3
  done
  echo "job $job: state $state, restarts $restarts after waiting up to $seconds s for: $condition" >&2
  cat "$WORK/hpctrain-$job.out" >&2 2>/dev/null || true
  return 1
}
# wait_for_line FILE PATTERN SECONDS: until FILE has a line matching the extended regex PATTERN (file polls only: no
# Slurm command, so a slow slurmctld cannot delay it); false after SECONDS or at the test's deadline.
wait_for_line() {
  local deadline=$((SECONDS + $3))
  ((deadline < test_deadline)) || deadline=$test_deadline
  until grep -qE "$2" "$1" 2>/dev/null; do
    ((SECONDS <= deadline)) || return 1
    sleep 0.05
  done
}
submit() { sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 --time=10 "$script" "$@"; }

cd "$WORK" || exit 1
export HPCTRAIN  # the job script finds hpctrain through $HPCTRAIN (sbatch passes the environment on)
make_spirals train.h5 2000 1
make_spirals validation.h5 400 2
write_deck() {  # write_deck FILE STEPS [EXTRA [train] LINE]
  cat >"$1" <<TOML
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "dropout", p = 0.1 }, { type = "linear", out = 3 } ]
[train]
steps = $2
log_every = 100
${3:-}
TOML
}

# --- (2) first: the interrupted job. It trains "forever" until the warning signal, which the watcher sends as soon as
# training has started. The test learns the step it stopped at from its train.log and, at once, sets the number of
# steps of the second segment (and of the reference run) to 300 more: the requeued job cannot start again within
# cred_expire (10 s) of its requeue, and hpctrain logs the stop before it exits, so the deck is rewritten in time
# without holding the job or taking the partition down (scontrol calls wait on slurmctld, which a busy machine delays).
# train.time_limit only bounds the run (and the reference run's length) should the signal not come: on a machine so
# busy that the watcher waits for a CPU for a minute, the test fails rather than running for many minutes.
write_deck deck_b.toml 1000000000 'time_limit = "00:01:30"'
job_b=$(submit deck_b.toml --output run_b) || { fail "sbatch failed"; exit 1; }
pass "submitted the job to interrupt: $job_b"
# The watcher runs in its own session (see setsid above). scancel --signal=USR1 --batch is what
# --signal=B:USR1@300 does 300 s before the time limit.
setsid bash -c 'until grep -q "^step " "$1/train.log" 2>/dev/null; do sleep 0.05; done
  scancel --signal=USR1 --batch "$2"' watcher "$WORK/run_b" "$job_b" &
watcher_pid=$!
if ! wait_for_line run_b/train.log "^step " 240; then
  fail "job $job_b did not start training within 240 s (state $(job_field "$job_b" JobState))"
  cat "hpctrain-$job_b.out" >&2 2>/dev/null
  exit 1
fi
pass "job $job_b is training"
if ! wait_for_line run_b/train.log "^stopping at step" 120; then
  fail "job $job_b did not stop within 120 s of starting to train (the signal was not delivered?)"
  tail -5 run_b/train.log >&2; cat "hpctrain-$job_b.out" >&2 2>/dev/null
  exit 1
fi
stop_line=$(grep "^stopping at step" run_b/train.log)
stopped=$(sed -n 's/^stopping at step \([0-9]*\).*/\1/p' <<<"$stop_line")
steps=$((stopped + 300))
write_deck deck_b.toml "$steps" # read again by the second segment (train.steps may change on resume)
write_deck deck_a.toml "$steps"
[[ $stop_line == *"after SIGUSR1"* ]] ||
  { fail "the run did not stop on SIGUSR1 (the watcher was too late?): '$stop_line'"; exit 1; }
pass "job $job_b stopped: ${stop_line%%;*}; both decks now train to step $steps"
wait_for "$job_b" 60 '[[ $restarts -ge 1 ]]' || { fail "job $job_b was not requeued"; exit 1; }
pass "job $job_b requeued (Restarts=$restarts)"
[[ $(sed -n 's/.*step-0*\([0-9]*\)\.h5/\1/p' run_b/checkpoints/latest) == "$stopped" ]] ||
  { fail "checkpoints/latest does not name the checkpoint of step $stopped: $(cat run_b/checkpoints/latest)"; exit 1; }

# --- (1) the uninterrupted reference, queued behind the second segment ---
job_a=$(submit deck_a.toml --output run_a)
wait_for "$job_b" 150 '[[ $state == COMPLETED ]]' && pass "job $job_b completed after its requeue" ||
  fail "job $job_b did not complete"
wait_for "$job_a" 150 '[[ $state == COMPLETED ]]' && pass "job $job_a (uninterrupted) completed" ||
  fail "job $job_a did not complete"

out_b=hpctrain-$job_b.out
grep -q "segment 2" "$out_b" && grep -q "requeueing job $job_b" "$out_b" && grep -q "got SIGUSR1" "$out_b" &&
  pass "job script: forwarded SIGUSR1, requeued, ran segment 2 (output appended to $out_b)" ||
  { fail "job script output lacks the forward/requeue/segment-2 lines"; cat "$out_b" >&2; }
grep -q "2 ranks" "run_a/train.log" && pass "srun started 2 ranks" || fail "run_a did not run on 2 ranks"
[[ $(job_field "$job_b" ExitCode) == 0:0 && $(job_field "$job_a" ExitCode) == 0:0 ]] &&
  pass "exit codes 0:0" || fail "exit codes $(job_field "$job_b" ExitCode) / $(job_field "$job_a" ExitCode)"

equal="metrics.h5 complete in both runs; the requeued run equals the uninterrupted one at step $steps"
$PYTHON - "$steps" <<'PY' && pass "$equal" || fail "final checkpoints or metrics differ"
import sys, h5py, numpy as np
steps = int(sys.argv[1])
for run in ("run_a", "run_b"):
    with h5py.File(f"{run}/metrics.h5", "r") as m:
        step, loss = m["/train/step"][()], m["/train/loss"][()]
        # One row per step, 1..steps, also across the requeue (rows past the checkpoint are dropped on resume).
        assert np.array_equal(step, np.arange(1, steps + 1)), (run, step[:3], step[-3:], len(step))
        assert np.all(np.isfinite(loss)), run
        assert loss[-100:].mean() < loss[:100].mean(), (run, "loss did not decrease")
        assert m["/eval/step"][-1] == steps and 0 < m["/eval/accuracy"][-1] <= 1, run
name = f"checkpoints/step-{steps:08d}.h5"
with h5py.File("run_a/" + name, "r") as a, h5py.File("run_b/" + name, "r") as b:
    compared = 0
    for group in ("model", "optimizer"):
        def check(path, item):
            global compared
            if isinstance(item, h5py.Dataset):
                assert np.array_equal(item[()], b[group + "/" + path][()]), path
                compared += 1
        a[group].visititems(check)
    assert compared >= 4, compared
PY

# --- (3) the mpiexec launcher inside the allocation (OpenMPI reads the allocation from Slurm) ---
write_deck deck_c.toml 200
job_c=$(HPCTRAIN_LAUNCHER=mpiexec HPCTRAIN_MPIEXEC_FLAGS=$MPIEXEC_FLAGS submit deck_c.toml --output run_c)
if wait_for "$job_c" 60 '[[ $state == COMPLETED ]]' && grep -q "2 ranks" run_c/train.log; then
  pass "HPCTRAIN_LAUNCHER=mpiexec: job $job_c trained on 2 ranks"
else
  fail "HPCTRAIN_LAUNCHER=mpiexec job $job_c"
fi

# --- (4) a job with GPUs: the script adds run.device=cuda (dry run: the stand-in GPUs cannot train) ---
job_d=$(HPCTRAIN_DRY_RUN=1 sbatch --parsable --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=2 "$script" deck_c.toml)
if wait_for "$job_d" 60 '[[ $state == COMPLETED ]]' && grep -q "^launch: srun .* --set run.device=cuda" "hpctrain-$job_d.out"; then
  pass "--gpus-per-node=2: $(grep -o "train deck_c.toml --resume auto --set run.device=cuda" "hpctrain-$job_d.out")"
else
  fail "job $job_d with GPUs: $(cat "hpctrain-$job_d.out" 2>/dev/null)"
fi
finish
