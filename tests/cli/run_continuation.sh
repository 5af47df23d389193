#!/usr/bin/env bash
# Carrying on from an earlier run: --init-from takes a checkpoint's parameters only (the loss starts where that run
# ended, not where a fresh run starts; fresh optimizer state and step count; another precision and rank count; another
# model's shapes refused naming the tensor); a resume with changed optimizer or schedule keys is refused naming them,
# and goes on with --allow-changed; a run extended with train.steps raised stretches or restarts its cosine schedule
# (the learning rates metrics.h5 records, against the formula), and a restarted schedule survives a later resume.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
"$HPCTRAIN" data generate blobs --samples 2000 --classes 3 --seed 1 --output train.h5 >/dev/null
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 50
[model]
layers = [ { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 32 }, { type = "relu" },
           { type = "linear", out = 3 } ]
[optimizer]
lr = 0.003
[schedule]
type = "cosine"
warmup_steps = 5
min_lr = 0.0001
[train]
steps = 40
log_every = 10
[checkpoint]
every_steps = 10
keep = 0
TOML

# ---- --init-from ----
run_ranks 2 train deck.toml --output base >base.log 2>&1 || { cat base.log >&2; fail "base run"; }
run_ranks 2 train deck.toml --output scratch --set train.steps=3 >scratch.log 2>&1 || fail "fresh run"
run_ranks 1 train deck.toml --output tuned --set train.steps=3 --set precision.mode=bf16 --init-from base \
  >tuned.log 2>&1 || { cat tuned.log >&2; fail "--init-from on 1 rank in bf16"; }
grep -q "parameters initialised from base/checkpoints/step-00000040.h5 (--init-from)" tuned.log &&
  pass "--init-from base: $(grep initialised tuned.log)" || { cat tuned.log >&2; fail "--init-from not logged"; }
$PYTHON - <<'PY' && pass "--init-from: loss starts where the base run ended; fresh steps and optimizer" || fail "--init-from"
import h5py
base, scratch, tuned = (h5py.File(f"{run}/metrics.h5", "r") for run in ("base", "scratch", "tuned"))
first_tuned, first_scratch, last_base = tuned["/train/loss"][0], scratch["/train/loss"][0], base["/train/loss"][-1]
print(f"first loss: fresh {first_scratch:.4f}, from base {first_tuned:.4f}; base ended at {last_base:.4f}")
assert first_tuned < 0.75 * first_scratch, (first_tuned, first_scratch)
assert abs(first_tuned - last_base) < 0.25 * first_scratch
assert list(tuned["/train/step"][()]) == [1, 2, 3]
assert abs(tuned["/train/lr"][0] - 0.003 / 5) < 1e-12  # the warm-up starts again
checkpoint = h5py.File("tuned/checkpoints/step-00000003.h5", "r")
assert checkpoint["/optimizer/step"][()] == 3 and checkpoint["/train/step"][()] == 3
PY
expect_error init_shapes "tensor /model/linear0/weight has shape \(32, 2\) but the deck's model needs \(16, 2\)" 2 \
  train deck.toml --output wrong --set 'model.layers[0].out=16' --init-from base/checkpoints/latest
[[ ! -e wrong ]] && pass "nothing written for the refused --init-from" || fail "--init-from refused but wrote wrong/"
expect_error init_shapes_dry_run "tensor /model/linear0/weight has shape \(32, 2\) but the deck's model needs \(16, 2\)" \
  2 train deck.toml --output wrong --set 'model.layers[0].out=16' --init-from base --dry-run
run_ranks 2 train deck.toml --output dry --init-from base --dry-run >dry.log 2>&1 &&
  grep -q "start: fresh, parameters from base/checkpoints/step-00000040.h5 (--init-from)" dry.log && [[ ! -e dry ]] &&
  pass "dry run: $(grep start: dry.log)" || { cat dry.log >&2; fail "dry run with --init-from"; }
expect_error init_and_resume "--init-from and --resume .* both name where to start" 1 train deck.toml --output x \
  --init-from base --resume base/checkpoints/latest

# ---- changed optimizer or schedule keys on resume ----
cp -r base changed
before=$(find changed -printf '%p %s %T@\n' | sort)
expect_error changed_keys "optimizer.lr 0.003 -> 0.01, schedule.type \"cosine\" -> \"constant\"" 2 train deck.toml \
  --output changed --resume auto --set train.steps=50 --set optimizer.lr=0.01 --set schedule.type=constant
grep -q "allow the change: --allow-changed optimizer.lr schedule.type" changed_keys.log &&
  pass "the hint names --allow-changed and the keys" || { cat changed_keys.log >&2; fail "hint"; }
[[ "$(find changed -printf '%p %s %T@\n' | sort)" == "$before" ]] && pass "refused resume left the run as it was" ||
  fail "refused resume changed the run"
expect_error changed_type "cannot resume .* with another optimizer \(optimizer.type \"adamw\" -> \"sgd\"\)" 2 \
  train deck.toml --output changed --resume auto --set optimizer.type=sgd --allow-changed optimizer
expect_error allow_unknown "--allow-changed optimizer.weight_decy: not an optimizer, schedule or loss key .*; did \
you mean 'optimizer.weight_decay'" 1 train deck.toml --output changed --resume auto --allow-changed optimizer.weight_decy
run_ranks 2 train deck.toml --output changed --resume auto --set train.steps=50 --set optimizer.lr=0.01 \
  --set schedule.type=constant --allow-changed optimizer.lr,schedule.type >allowed.log 2>&1 ||
  { cat allowed.log >&2; fail "allowed resume"; }
grep -q "resuming with changed keys (--allow-changed): optimizer.lr 0.003 -> 0.01, schedule.type" allowed.log &&
  $PYTHON -c "import h5py; lr = h5py.File('changed/metrics.h5')['/train/lr'][()]; assert len(lr) == 50 and all(lr[40:] == 0.01), lr" &&
  pass "allowed: resumed at step 40 with lr 0.01" || { cat allowed.log >&2; fail "allowed resume"; }

# ---- extension: stretch (the default) or restart ----
cp -r base stretched
cp -r base restarted
run_ranks 2 train deck.toml --output stretched --resume auto --set train.steps=80 >stretched.log 2>&1 ||
  { cat stretched.log >&2; fail "stretch"; }
run_ranks 2 train deck.toml --output restarted --resume auto --set train.steps=80 --extend restart >restarted.log 2>&1 ||
  { cat restarted.log >&2; fail "restart"; }
grep -q "extended from 40 to 80 steps: the learning-rate schedule is stretched" stretched.log &&
  grep -q "extended from 40 to 80 steps: the learning-rate schedule restarts at step 40" restarted.log &&
  pass "the extension is logged" || { cat stretched.log restarted.log >&2; fail "extension not logged"; }
# An interruption after the restart: resuming from step 60 keeps the restarted schedule (no --extend needed).
run_ranks 2 train deck.toml --output again --resume restarted/checkpoints/step-00000060.h5 --set train.steps=80 \
  >again.log 2>&1 || { cat again.log >&2; fail "resume after restart"; }
expect_error extend_unextended "--extend: the run is not extended \(the checkpoint's run has 80 steps, the deck 80\)" 2 \
  train deck.toml --output stretched2 --resume stretched --set train.steps=80 --extend restart
$PYTHON - <<'PY' && pass "stretched and restarted schedules follow the formula" || fail "extension learning rates"
import math, h5py, numpy as np
base_lr, min_lr, warmup = 0.003, 0.0001, 5
def cosine(step, total):  # the schedule of docs/input-reference.md, 0-based step
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * progress))
def rates(run):
    f = h5py.File(f"{run}/metrics.h5", "r")
    return f["/train/step"][()], f["/train/lr"][()]
base_steps, base = rates("base")
for run, expected in (("stretched", [cosine(s, 80) for s in range(40, 80)]),
                      ("restarted", [cosine(s - 40, 40) for s in range(40, 80)])):
    steps, lr = rates(run)
    assert list(steps) == list(range(1, 81)), steps
    assert np.array_equal(lr[:40], base), f"{run}: the first 40 rows changed"
    assert np.allclose(lr[40:], expected, rtol=1e-12, atol=0), (run, lr[40:45], expected[:5])
    print(f"{run}: lr at steps 41..43 {lr[40]:.3e} {lr[41]:.3e} {lr[42]:.3e}, at 80 {lr[79]:.3e}")
steps, lr = rates("again")
assert list(steps) == list(range(61, 81)), steps
assert np.allclose(lr, [cosine(s - 40, 40) for s in range(60, 80)], rtol=1e-12, atol=0), lr
PY
finish
