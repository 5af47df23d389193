#!/usr/bin/env bash
# The best checkpoint, early stopping, intervals in epochs and the default periodic checkpoint, end to end:
# - checkpoint.best_metric keeps checkpoints/best (the first step of the highest validation accuracy) while rotation
#   (keep = 1) removes later, worse checkpoints; evaluate takes RUN/checkpoints/best;
# - early stopping stops at the expected evaluation (train.early_stopping_min_delta too large for any later evaluation
#   to improve: patience P stops at evaluation P + 1), exit 0, status complete, train.log and metrics.h5 say why;
#   resuming it trains nothing; resuming with a larger patience continues with the checkpointed counter and ends
#   bit-identical to an uninterrupted run with that patience;
# - train.eval_every_epochs and checkpoint.every_epochs give the expected steps;
# - the default checkpoint every 30 minutes, on the simulated clock (HPCTRAIN_TEST_SECONDS_PER_STEP: no wall-clock
#   timing), does not change the results, and `false` turns it off.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2000 1
make_spirals validation.h5 500 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 50
[model]
layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
[train]
steps = 200
eval_every = 10
log_every = 1000
[checkpoint]
best_metric = "accuracy"
every_steps = 10
keep = 1
TOML

# --- The best checkpoint survives rotation. ---
run_ranks 2 train deck.toml --output best >best.log 2>&1 || { cat best.log >&2; fail "best: training run"; }
$PYTHON - <<'PY' && pass "best: checkpoints/best is the first step of the highest accuracy, kept beside latest" ||
import os, h5py, numpy as np
m = h5py.File("best/metrics.h5", "r")
steps, accuracy = m["/eval/step"][()], m["/eval/accuracy"][()]
assert list(steps) == list(range(10, 201, 10)), steps
first_best = int(steps[np.argmax(accuracy)])  # argmax: the first of equal maxima, as strict improvement keeps
print(f"validation accuracy peaks at {accuracy.max():.4f} at step {first_best}; the last is {accuracy[-1]:.4f}")
assert m.attrs["best_metric"] == "accuracy" and m.attrs["best_step"] == first_best, dict(m.attrs)
assert m.attrs["best_value"] == accuracy.max()
assert "early_stopping" not in m.attrs
best = open("best/checkpoints/best").read().strip()
latest = open("best/checkpoints/latest").read().strip()
assert best == f"step-{first_best:08d}.h5" and latest == "step-00000200.h5", (best, latest)
files = sorted(f for f in os.listdir("best/checkpoints") if f.endswith(".h5"))
assert files == sorted({best, latest}), files  # keep = 1: every other checkpoint was removed
c = h5py.File("best/checkpoints/" + best, "r")
assert c["/train/best_step"][()] == first_best and c["/train/best_value"][()] == accuracy.max()
assert c["/train/evaluations_without_improvement"][()] == 0
PY
  fail "best: checkpoints or metrics"
grep -q "eval at step 10: .*(new best accuracy)" best/train.log && grep -q "(best: checkpoints/best)" best/train.log &&
  pass "best: train.log marks new bests" || fail "best: train.log lacks the new-best notes"
"$HPCTRAIN" evaluate best/checkpoints/best --data validation.h5 >evaluate.log 2>&1 || { cat evaluate.log >&2; fail "evaluate best"; }
best_value=$($PYTHON -c 'import h5py; print("%.4f" % h5py.File("best/metrics.h5", "r").attrs["best_value"])')
grep -q "$(cat best/checkpoints/best) on validation.h5 .*accuracy $best_value" evaluate.log &&
  pass "evaluate RUN/checkpoints/best: $(cat evaluate.log)" || { cat evaluate.log >&2; fail "evaluate best: not accuracy $best_value"; }
"$HPCTRAIN" checkpoint verify best/checkpoints/best >verify.log 2>&1 && grep -q "$(cat best/checkpoints/best)" verify.log &&
  pass "checkpoint verify RUN/checkpoints/best" || { cat verify.log >&2; fail "checkpoint verify best"; }

# --- Early stopping at the expected evaluation. ---
# min_delta 10: only the first evaluation (step 10) improves; patience 2 stops at the third (step 30).
early=(--set train.early_stopping_min_delta=10 --set checkpoint.keep=1)
run_ranks 2 train deck.toml --output early --set train.early_stopping_patience=2 "${early[@]}" >early.log 2>&1 ||
  { cat early.log >&2; fail "early: training run"; }
[[ $(cat early/status) == "complete 0 step 30" ]] && pass "early: status 'complete 0 step 30'" ||
  fail "early: status '$(cat early/status)'"
grep -q "early stopping at step 30 of 200: validation accuracy did not improve by more than 10 in 2 evaluations" \
  early/train.log && pass "early: train.log says why" || { cat early/train.log >&2; fail "early: no early stopping line"; }
$PYTHON - <<'PY' && pass "early: best step 10 kept, stopped after step 30, metrics.h5 attributes" || fail "early: files"
import os, h5py
m = h5py.File("early/metrics.h5", "r")
assert list(m["/eval/step"][()]) == [10, 20, 30], m["/eval/step"][()]
assert m.attrs["best_step"] == 10 and m.attrs["early_stopping_step"] == 30, dict(m.attrs)
assert "did not improve" in m.attrs["early_stopping"]
assert len(m["/train/step"]) == 30
assert open("early/checkpoints/best").read().strip() == "step-00000010.h5"
assert sorted(f for f in os.listdir("early/checkpoints") if f.endswith(".h5")) == ["step-00000010.h5", "step-00000030.h5"]
c = h5py.File("early/checkpoints/step-00000030.h5", "r")
assert c["/train/evaluations_without_improvement"][()] == 2 and c["/train/best_step"][()] == 10
PY
run_ranks 2 train deck.toml --output early --resume auto --set train.early_stopping_patience=2 "${early[@]}" \
  >again.log 2>&1 || { cat again.log >&2; fail "early: resume"; }
grep -q "stopped early at step 30 .*nothing to train" again.log && [[ $(cat early/status) == "complete 0 step 30" ]] &&
  pass "early: resuming a run that stopped early trains nothing" || { cat again.log >&2; fail "early: resumed run trained"; }

# Patience 4 straight through stops at step 50; the stopped run resumed with patience 4 goes on from its counter (2
# evaluations already without improvement) and stops at step 50 too, bit-identical.
run_ranks 2 train deck.toml --output straight --set train.early_stopping_patience=4 "${early[@]}" >straight.log 2>&1 ||
  { cat straight.log >&2; fail "early: patience 4"; }
run_ranks 2 train deck.toml --output early --resume auto --set train.early_stopping_patience=4 "${early[@]}" \
  >continued.log 2>&1 || { cat continued.log >&2; fail "early: continued with patience 4"; }
$PYTHON - <<'PY' && pass "early: resumed with patience 4 stops at step 50, bit-identical to the uninterrupted run" ||
import h5py, numpy as np
runs = {}
for run in ("straight", "early"):
    m = h5py.File(f"{run}/metrics.h5", "r")
    assert list(m["/eval/step"][()]) == [10, 20, 30, 40, 50], (run, m["/eval/step"][()])
    assert m.attrs["early_stopping_step"] == 50, (run, dict(m.attrs))
    assert open(f"{run}/status").read().strip() == "complete 0 step 50", run
    c = h5py.File(f"{run}/checkpoints/step-00000050.h5", "r")
    runs[run] = {}
    c.visititems(lambda name, item: runs[run].__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
a, b = runs["straight"], runs["early"]
assert a.keys() == b.keys() and any(k.startswith("model/") for k in a), sorted(a)
for name in a:
    assert np.array_equal(a[name], b[name]), name
PY
  fail "early: continued run differs"

# Resumed with another metric, the best starts over: the first evaluation (step 60) is the best loss, and patience 4
# with min_delta 10 stops at step 100.
run_ranks 2 train deck.toml --output straight --resume auto --set train.early_stopping_patience=4 "${early[@]}" \
  --set checkpoint.best_metric=loss >other_metric.log 2>&1 || { cat other_metric.log >&2; fail "early: other metric"; }
$PYTHON - <<'PY' && pass "early: resumed with checkpoint.best_metric = loss, the best starts over" ||
import h5py
m = h5py.File("straight/metrics.h5", "r")
assert m.attrs["best_metric"] == "loss" and m.attrs["best_step"] == 60 and m.attrs["early_stopping_step"] == 100, dict(m.attrs)
assert open("straight/checkpoints/best").read().strip() == "step-00000060.h5"
assert open("straight/status").read().strip() == "complete 0 step 100"
PY
  fail "early: other metric"

# Continuing from a checkpoint older than the best (step 5; the best is step 10) abandons the newer ones and `best` with
# them. The resumed run stops after one step on train.time_limit (the simulated clock: no wall-clock timing), before
# any evaluation, so `best` must be absent; resumed again, step 10's evaluation is the best again.
run_ranks 2 train deck.toml --output older --set checkpoint.every_steps=5 --set checkpoint.keep=0 --set train.steps=20 \
  --set train.early_stopping_min_delta=10 >older.log 2>&1 || { cat older.log >&2; fail "older: training run"; }
[[ $(cat older/checkpoints/best) == step-00000010.h5 ]] || fail "older: best '$(cat older/checkpoints/best)'"
status=0
HPCTRAIN_TEST_SECONDS_PER_STEP=1 run_ranks 2 train deck.toml --output older --resume older/checkpoints/step-00000005.h5 \
  --set checkpoint.every_steps=5 --set checkpoint.keep=0 --set train.steps=20 --set train.early_stopping_min_delta=10 \
  --set train.time_limit=00:00:01 >older-resumed.log 2>&1 || status=$?
checkpoints=$(cd older/checkpoints && echo step-*.h5)
if ((status == 75)) && [[ ! -e older/checkpoints/best && $checkpoints == "step-00000005.h5 step-00000006.h5" ]]; then
  pass "older: continuing from step 5 removed the newer checkpoints and the best that named one"
else
  cat older-resumed.log >&2
  fail "older: exit $status, checkpoints '$checkpoints', best '$(cat older/checkpoints/best 2>/dev/null)'"
fi
run_ranks 2 train deck.toml --output older --resume auto --set checkpoint.every_steps=5 --set checkpoint.keep=0 \
  --set train.steps=20 --set train.early_stopping_min_delta=10 >older-again.log 2>&1 || fail "older: resumed again"
[[ $(cat older/checkpoints/best) == step-00000010.h5 && $(cat older/status) == "complete 0 step 20" ]] &&
  pass "older: resumed again, step 10 is the best again" || fail "older: best '$(cat older/checkpoints/best)'"

# --- Intervals in epochs: 40 steps per epoch (2000 samples, batch 50). ---
run_ranks 2 train deck.toml --output epochs --set train.eval_every=0 --set train.eval_every_epochs=1 \
  --set checkpoint.every_steps=0 --set checkpoint.every_epochs=2 --set checkpoint.keep=0 \
  --set checkpoint.best_metric=none >epochs.log 2>&1 || { cat epochs.log >&2; fail "epochs: training run"; }
evals=$($PYTHON -c 'import h5py; print(*h5py.File("epochs/metrics.h5", "r")["/eval/step"][()])')
checkpoints=$(cd epochs/checkpoints && echo step-*.h5)
[[ $evals == "40 80 120 160 200" ]] && pass "epochs: evaluations after steps $evals" || fail "epochs: evaluations '$evals'"
[[ $checkpoints == "step-00000080.h5 step-00000160.h5 step-00000200.h5" ]] &&
  pass "epochs: checkpoints $checkpoints" || fail "epochs: checkpoints '$checkpoints'"
grep -q "checkpoints: every 80 steps, at least every 30 min (checkpoint.every_seconds), at the end; evaluation: every 40 steps" \
  epochs/train.log && pass "epochs: the log's head states the schedule" || fail "epochs: no schedule line"
run_ranks 1 train deck.toml --dry-run --output plan --set train.eval_every=0 --set train.eval_every_epochs=1 \
  --set checkpoint.every_steps=0 --set checkpoint.every_epochs=2 >plan.log 2>&1 || { cat plan.log >&2; fail "dry run"; }
grep -q "evaluation: every 40 steps and at the end: 5 evaluations" plan.log &&
  grep -q "checkpoints: every 80 steps (2), every 1800 s, at the end" plan.log &&
  grep -q "best checkpoint: by validation accuracy (checkpoints/best)" plan.log &&
  pass "epochs: --dry-run's plan has the epoch intervals and the best checkpoint" || { cat plan.log >&2; fail "dry run plan"; }
expect_error epochs_and_steps "train.eval_every \(10\) and train.eval_every_epochs \(1\) are both set" 1 \
  train deck.toml --output both --set train.eval_every_epochs=1

# --- The default periodic checkpoint on the simulated clock: 600 s per step, 30 minutes = 3 steps after the last
# checkpoint ended (the step that starts at >= 1800 s is checkpointed: steps 4, 8, 12, 16, then the end). ---
periodic=(--set train.steps=20 --set checkpoint.every_steps=0 --set checkpoint.keep=0 --set checkpoint.best_metric=none)
HPCTRAIN_TEST_SECONDS_PER_STEP=600 run_ranks 2 train deck.toml --output periodic "${periodic[@]}" >periodic.log 2>&1 ||
  { cat periodic.log >&2; fail "periodic: training run"; }
HPCTRAIN_TEST_SECONDS_PER_STEP=600 run_ranks 2 train deck.toml --output unsaved "${periodic[@]}" \
  --set checkpoint.every_seconds=false >unsaved.log 2>&1 || { cat unsaved.log >&2; fail "periodic: off"; }
checkpoints=$(cd periodic/checkpoints && echo step-*.h5)
[[ $checkpoints == "step-00000004.h5 step-00000008.h5 step-00000012.h5 step-00000016.h5 step-00000020.h5" ]] &&
  pass "periodic: by default a checkpoint every 30 minutes: $checkpoints" || fail "periodic: checkpoints '$checkpoints'"
checkpoints=$(cd unsaved/checkpoints && echo step-*.h5)
[[ $checkpoints == "step-00000020.h5" ]] && pass "periodic: every_seconds = false: only $checkpoints" ||
  fail "periodic off: checkpoints '$checkpoints'"
$PYTHON - <<'PY' && pass "periodic: results identical with and without the periodic checkpoints" || fail "periodic: results differ"
import h5py, numpy as np
a, b = h5py.File("periodic/metrics.h5", "r"), h5py.File("unsaved/metrics.h5", "r")
assert np.array_equal(a["/train/loss"][()], b["/train/loss"][()]) and len(a["/train/loss"]) == 20
assert np.array_equal(a["/eval/loss"][()], b["/eval/loss"][()])
x, y = h5py.File("periodic/checkpoints/step-00000020.h5", "r"), h5py.File("unsaved/checkpoints/step-00000020.h5", "r")
assert np.array_equal(x["/model/linear0/weight"][()], y["/model/linear0/weight"][()])
assert "/train/best_step" not in x  # a run without checkpoint.best_metric keeps the layout it had
PY

# --- Errors. ---
expect_error best_metric_of_task 'checkpoint.best_metric = "r2" is not computed by a model.loss = "cross_entropy" run' 2 \
  train deck.toml --output wrong --set checkpoint.best_metric=r2
expect_error top5_of_three_classes "top-5 accuracy is computed with more than 5 classes only" 2 \
  train deck.toml --output top5 --set checkpoint.best_metric=top5_accuracy
[[ ! -e top5 ]] && pass "top5: refused before the output directory was made" || fail "top5: output directory made"
expect_error no_best "'unsaved/checkpoints/best': the run has no best checkpoint" 1 \
  evaluate unsaved/checkpoints/best --data validation.h5
finish
