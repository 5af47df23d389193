#!/usr/bin/env bash
# Start-up checks whose failures a real MPI or C library does not produce on a test machine: a preloaded test double
# (tests/support/start_faults.c) changes their answers.
# - MPI_Init_thread granting only MPI_THREAD_SINGLE: every rank stops with one message, exit 1;
# - pthread_sigmask failing to block the checkpoint signals (they are taken by a watcher thread): the run stops with
#   the C library's reason instead of training on without the checkpoint-on-signal it was asked for, exit 1.
# - pthread_sigmask failing to unblock a signal the deck does not checkpoint on (its default action, delivered by the
#   watcher thread): the process still ends as the signal would have ended it (exit 128 + the signal), saying why.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
: "${START_FAULTS:?set by CTest: the path of the test double}"
make_spirals train.h5 256 1
tiny_mlp_deck deck.toml
printf '[checkpoint]\non_signal = ["USR1"]\n' >>deck.toml
# Only hpctrain gets the double, not the launcher.
printf '#!/usr/bin/env bash\nexport LD_PRELOAD=%q${LD_PRELOAD:+:$LD_PRELOAD}\nexec %q "$@"\n' "$START_FAULTS" "$HPCTRAIN" \
  >hpctrain-with-faults
chmod +x hpctrain-with-faults
HPCTRAIN=$WORK/hpctrain-with-faults

run_ranks 2 train deck.toml --output plain >plain.log 2>&1 && pass "the double changes nothing by itself" ||
  { cat plain.log >&2; fail "a run with the double preloaded failed"; }
HPCTRAIN_TEST_MPI_THREAD_SINGLE=1 expect_error thread-single "needs MPI_THREAD_FUNNELED" 2 train deck.toml --output single
[[ ! -e single ]] && pass "thread-single: nothing written" || fail "thread-single: wrote $(ls single)"
HPCTRAIN_TEST_SIGMASK_FAILS=1 expect_error sigmask "blocking the checkpoint signals failed: Invalid argument" 1 train \
  deck.toml --output sigmask
[[ ! -e sigmask ]] && pass "sigmask: nothing written" || fail "sigmask: wrote $(ls sigmask)"

# USR2 is watched but this deck checkpoints on USR1 only: its default action (ending the rank) must still happen.
# shellcheck disable=SC2086
HPCTRAIN_TEST_UNBLOCK_FAILS=1 $MPIEXEC -n 1 "$HPCTRAIN" train deck.toml --set train.steps=1000000 --set train.log_every=10 \
  --output "$WORK/unblock" >unblock.log 2>&1 &
launcher=$!
wait_until 180 grep -qs "step .*/1000000" unblock.log || fail "unblock: no step logged within 180 s"
rank=$(pgrep -f "train deck.toml .*--output $WORK/unblock" | grep -v "^$launcher\$" | tail -1)
[[ -n $rank ]] && kill -USR2 "$rank"
timeout 120 tail --pid=$launcher -f /dev/null || { kill -KILL "$launcher" $rank; fail "unblock: SIGUSR2 did not end the run"; }
status=0
wait $launcher || status=$?
grep -q "ending on SIGUSR2 without its default action (Invalid argument)" unblock.log && ((status != 0)) &&
  pass "unblock: SIGUSR2 ends the run (exit $status) and says why" || { cat unblock.log >&2; fail "unblock: exit $status"; }
finish
