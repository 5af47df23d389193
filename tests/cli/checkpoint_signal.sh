#!/usr/bin/env bash
# Checkpoint before walltime: SIGUSR1 delivered to ONE rank makes every rank write a checkpoint at the next step
# boundary and exit with status 75; resuming it reaches the same parameters as an uninterrupted run.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 3000 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "dropout", p = 0.1 }, { type = "linear", out = 3 } ]
[train]
steps = 1000000
log_every = 100
TOML
# shellcheck disable=SC2086
$MPIEXEC -n 2 "$HPCTRAIN" train deck.toml --output "$WORK/interrupted" >interrupted.log 2>&1 &
launcher=$!
# Up to 180 s for the first logged step: a loaded machine can take many seconds to start two ranks.
wait_until 180 grep -qs "step .*/1000000" interrupted.log || fail "no step logged within 180 s"
ranks=($(pgrep -f "train deck.toml --output $WORK/interrupted" | grep -v "^$launcher\$"))
((${#ranks[@]} >= 2)) || fail "expected 2 rank processes, found ${#ranks[@]}"
kill -USR1 "${ranks[-1]}"  # one rank only
status=0
timeout 120 tail --pid=$launcher -f /dev/null || fail "the run did not stop within 120 s of the signal"
wait $launcher || status=$?
((status == 75)) && pass "exit status 75 after SIGUSR1" || { cat interrupted.log >&2; fail "exit status $status, expected 75"; }
grep -q "stopping at step" interrupted.log && pass "$(grep "stopping at step" interrupted.log)" || fail "no stop message"
"$HPCTRAIN" checkpoint verify interrupted >verify.log && pass "$(cat verify.log)" || fail "checkpoint not sound"
stopped=$(sed -n 's/.*step-0*\([0-9]*\)\.h5/\1/p' interrupted/checkpoints/latest)
((stopped > 0)) || fail "no committed checkpoint step"
target=$((stopped + 15))
run_ranks 2 train deck.toml --output interrupted --resume auto --set train.steps=$target >resumed.log 2>&1 ||
  { cat resumed.log >&2; fail "resume after the signal"; }
run_ranks 2 train deck.toml --output straight --set train.steps=$target >straight.log 2>&1 || fail "uninterrupted run"
$PYTHON - "$target" <<'PY' && pass "resumed run equals the uninterrupted one at step $target" || fail "parameters differ"
import sys, h5py, numpy as np
name = f"checkpoints/step-{int(sys.argv[1]):08d}.h5"
a, b = h5py.File("interrupted/" + name, "r"), h5py.File("straight/" + name, "r")
for group in ("model", "optimizer"):
    def check(path, item):
        if isinstance(item, h5py.Dataset):
            assert np.array_equal(item[()], b[group + "/" + path][()]), path
    a[group].visititems(check)
PY
finish
