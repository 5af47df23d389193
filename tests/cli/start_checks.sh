#!/usr/bin/env bash
# Start-up checks whose failures a real MPI or C library does not produce on a test machine: a preloaded test double
# (tests/support/start_faults.c) changes their answers.
# - MPI_Init_thread granting only MPI_THREAD_SINGLE: every rank stops with one message, exit 1;
# - pthread_sigmask failing to block the checkpoint signals (they are taken by a watcher thread): the run stops with
#   the C library's reason instead of training on without the checkpoint-on-signal it was asked for, exit 1.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
: "${START_FAULTS:?set by CTest: the path of the test double}"
make_spirals train.h5 256 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 8 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 2
[checkpoint]
on_signal = ["USR1"]
TOML
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
finish
