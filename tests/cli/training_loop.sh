#!/usr/bin/env bash
# Gradient accumulation: train.accumulate = 4 (micro-batches of a quarter of the batch, one all-reduce per step) follows
# the same losses as accumulate = 1 to rounding (relative 1e-5 over 30 fp32 steps, documented in
# docs/input-reference.md). train.time_limit and checkpoint.every_seconds decide exact steps on the simulated clock;
# the run stops cleanly with a committed checkpoint and exit status 75; OUTPUT/status says how each run ended.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 4000 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 32 }, { type = "layernorm" }, { type = "gelu" }, { type = "dropout", p = 0.1 },
           { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
[train]
steps = 30
log_every = 10
TOML
run_ranks 2 train deck.toml --output k1 >k1.log 2>&1 || { cat k1.log >&2; fail "accumulate 1"; }
run_ranks 2 train deck.toml --output k4 --set train.accumulate=4 >k4.log 2>&1 || { cat k4.log >&2; fail "accumulate 4"; }
$PYTHON - <<'PY' && pass "accumulate = 4 matches accumulate = 1" || fail "accumulation differs"
import h5py, numpy as np
a = h5py.File("k1/metrics.h5", "r")["/train/loss"][()]
b = h5py.File("k4/metrics.h5", "r")["/train/loss"][()]
rel = np.max(np.abs(a - b) / np.abs(a))
print(f"largest relative loss difference over {len(a)} steps: {rel:.2e}")
assert len(a) == len(b) == 30 and 0 < rel < 1e-5, rel  # > 0: the micro-batches really summed in another order
PY
expect_error accumulate_not_divisible "train.accumulate = 5 does not divide the 32 samples per rank" 2 \
  train deck.toml --output k5 --set train.accumulate=5

# train.time_limit and checkpoint.every_seconds on the simulated clock: HPCTRAIN_TEST_SECONDS_PER_STEP=1 makes every
# step take exactly 1 s of rank 0's clock whatever the machine's speed, so the steps the rules decide are exact.
# every_seconds = 2: a step that starts 2 s or more after the last checkpoint ended is checkpointed: steps 3 and 6.
# time_limit = 10 s: the step starting at 5 s sees 5 + 3 x 1 s (recent steps) + 2 x 1 s (the minimum checkpoint
# time) >= 10, so the run checkpoints and stops after it, at step 6, with status 75.
status=0
HPCTRAIN_TEST_SECONDS_PER_STEP=1 run_ranks 2 train deck.toml --output timed --set train.steps=100000000 \
  --set train.time_limit=00:00:10 --set checkpoint.every_seconds=2 --set checkpoint.keep=0 \
  --status-file timed.status >timed.log 2>&1 || status=$?
((status == 75)) && pass "time limit: exit status 75" || { cat timed.log >&2; fail "time limit: exit status $status"; }
grep -q "stopping at step 6 after nearing train.time_limit" timed.log && "$HPCTRAIN" checkpoint verify timed >/dev/null &&
  pass "time limit: stopped at step 6, checkpoint committed" || { cat timed.log >&2; fail "time limit: not at step 6"; }
checkpoints=$(cd timed/checkpoints && echo step-*.h5)
[[ $checkpoints == "step-00000003.h5 step-00000006.h5" ]] && pass "every_seconds = 2: checkpoints at steps 3 and 6" ||
  fail "every_seconds = 2: checkpoints '$checkpoints', expected steps 3 and 6"
for file in timed/checkpoints/step-*.h5; do
  "$HPCTRAIN" checkpoint verify "$file" >/dev/null || fail "every_seconds: $file does not verify"
done

# The status file (OUTPUT/status, and --status-file's copy): how the run ended, for job scripts.
expect_status() {  # expect_status FILE LINE
  local found
  found=$(cat "$1" 2>/dev/null || echo "(no file)")
  [[ $found == "$2" ]] && pass "$1: $2" || fail "$1: '$found', expected '$2'"
}
expect_status timed/status "checkpointed 75 step 6"
expect_status timed.status "checkpointed 75 step 6"
expect_status k1/status "complete 0 step 30"
run_ranks 2 train deck.toml --output k6 --set train.accumulate=5 --status-file k6.status >k6.log 2>&1 || true
expect_status k6.status "failed 2 step 0"
[[ ! -e k6 ]] && pass "a run refused at set-up leaves no output directory" || fail "k6/ was created"
finish
