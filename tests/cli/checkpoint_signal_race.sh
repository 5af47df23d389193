#!/usr/bin/env bash
# SIGTERM to mpiexec and the ranks together, as `timeout` and some batch systems send it, at a random moment from
# start-up on: every try must end with a committed, sound checkpoint (exit status 75). Open MPI's mpiexec forwards the
# signal to the ranks and kills them about 2 s later, so a rank must react before then, also during start-up (the
# signals are recorded from the start of main), and never be interrupted inside MPI (they are taken by one watcher
# thread; handlers that interrupted MPI's progress engine corrupted its heap in 3 of 40 tries).
# The result is a count, not a timing: HPCTRAIN_SIGNAL_TRIES tries (default 50) in two lanes side by side.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 64 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 1000000000
log_every = 1000
TOML
tries=${HPCTRAIN_SIGNAL_TRIES:-50}

# The ranks of run directory $1 block SIGTERM in their main thread: main has begun (the earliest a program can
# react; a signal before that, while the loader maps the executable, kills any program).
ranks_started() {
  local count=0 pid mask
  for pid in $(pgrep -f "train deck.toml --output $1\$"); do
    mask=$(awk '/^SigBlk/{print $2}' "/proc/$pid/status" 2>/dev/null) || continue
    [[ -n $mask ]] && (((16#$mask >> 14) & 1)) && count=$((count + 1))
  done
  ((count >= 2))
}

lane() {  # lane NAME TRIES: one try after another; prints the committed count
  local name=$1 committed=0 try status
  for try in $(seq "$2"); do
    local run="$WORK/$name-$try"
    # shellcheck disable=SC2086
    setsid $MPIEXEC -n 2 "$HPCTRAIN" train deck.toml --output "$run" >"$run.log" 2>&1 &
    local launcher=$!
    wait_until 60 ranks_started "$run" || { echo "$name $try: the ranks did not start" >&2; kill -KILL -- -$launcher; }
    sleep "0.$((RANDOM % 8))$((RANDOM % 10))"  # 0 to 0.8 s: start-up, the first steps, or well into training
    kill -TERM -- -$launcher 2>/dev/null || true
    status=0
    wait $launcher || status=$?
    if "$HPCTRAIN" checkpoint verify "$run" >/dev/null 2>&1 && grep -q "^checkpointed 75" "$run/status"; then
      committed=$((committed + 1))
    else
      echo "$name $try: launcher exit $status, no committed checkpoint; its log:" >&2
      tail -5 "$run.log" >&2
    fi
    rm -rf "$run"
  done
  echo "$committed" >"$WORK/$name.count"
}

lane a $((tries / 2)) &
lane b $((tries - tries / 2))
wait
committed=$(($(cat a.count) + $(cat b.count)))
((committed == tries)) && pass "$committed of $tries SIGTERMs to mpiexec and the ranks together ended in a committed checkpoint" ||
  fail "only $committed of $tries SIGTERMs ended in a committed checkpoint"
finish
