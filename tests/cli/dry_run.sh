#!/usr/bin/env bash
# train --dry-run: the plan's numbers for a known deck (steps, epochs, batches, evaluations, the parameter count
# computed here from the layer widths), printed once under mpiexec; nothing created (no run directory, no status
# file) or changed (a run it would resume); a bad data path or a bad batch gives train's own error.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 1024 1
make_spirals validation.h5 300 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 12 }, { type = "relu" },
           { type = "linear", out = 3 } ]
[train]
epochs = 3
eval_every = 20
log_every = 10
[checkpoint]
every_steps = 25
TOML

run_ranks 2 train deck.toml --output dry --status-file status.txt --dry-run >dry.log 2>&1 ||
  { cat dry.log >&2; fail "dry run"; }
cat dry.log
[[ ! -e dry && ! -e status.txt ]] && pass "no run directory, no status file" || fail "the dry run created files"
(($(grep -c "^dry run of" dry.log) == 1)) && pass "printed once on 2 ranks" || fail "printed $(grep -c "^dry run of" dry.log) times"
$PYTHON - <<'PY' && pass "the plan's numbers" || fail "the plan's numbers"
import re
text = open("dry.log").read()
widths = [2, 16, 12, 3]  # the features of spirals, then each linear layer's out
parameters = sum(i * o + o for i, o in zip(widths, widths[1:]))
steps_per_epoch = 1024 // 64  # every rank reads 512 samples in batches of 32
steps = 3 * steps_per_epoch
evaluations = len([s for s in range(1, steps + 1) if s % 20 == 0 or s == steps])
def number(pattern):
    found = re.search(pattern, text)
    assert found, f"no '{pattern}' in the output"
    return found.groups()
assert number(r"total parameters: (\d+)\n") == (str(parameters),), number(r"total parameters: (\d+)\n")
assert number(r"plan: (\d+) steps = ([\d.]+) epochs of (\d+) steps \(each rank reads (\d+) batches of (\d+) samples") \
    == (str(steps), "3.00", str(steps_per_epoch), str(steps_per_epoch), "32")
assert number(r"evaluation: every 20 steps and at the end: (\d+) evaluations of 300 samples \((\d+) batches per rank") \
    == (str(evaluations), str(-(-300 // 64)))
assert number(r"checkpoints: every 25 steps \((\d+)\)")[0] == str(steps // 25)
# fp32 AdamW: master, gradients and two state vectors of 4 bytes per parameter
assert number(r"parameters \(fp32 run: fp32 master\) .*\((\d+) bytes\)") == (str(4 * parameters),)
assert number(r"gradients \(fp32\) .*\((\d+) bytes\)") == (str(4 * parameters),)
assert number(r"optimizer state \(AdamW exp_avg, exp_avg_sq\) .*\((\d+) bytes\)") == (str(8 * parameters),)
# activations of 32 rows: input (2) + every layer's output (16, 16, 12, 12, 3) + 2 scratch rows of the widest (16)
activations = 32 * 4 * (2 + 16 + 16 + 12 + 12 + 3 + 2 * 16)
assert number(r"activations \(32 rows per rank\) .*\((\d+) bytes\)") == (str(activations),)
assert number(r"total .*\((\d+) bytes\)") == (str(16 * parameters + activations),)
assert "start: fresh" in text and "output: dry" in text
print(f"{parameters} parameters, {steps} steps, {evaluations} evaluations")
PY
# bf16: a 16-bit working copy besides the fp32 master
run_ranks 1 train deck.toml --output dry --set precision.mode=bf16 --dry-run >bf16.log 2>&1 || { cat bf16.log >&2; fail "bf16"; }
grep -qE "16-bit working copy of the parameters .*\($((2 * (2 * 16 + 16 + 16 * 12 + 12 + 12 * 3 + 3))) bytes\)" bf16.log &&
  pass "bf16: working copy counted" || { cat bf16.log >&2; fail "bf16: working copy"; }

# Evaluation's memory: a classification model counts its hits on the device (no copy of the outputs, the total above);
# a regression model copies an evaluation batch's outputs to the host in fp32: 16 rows per rank x 3 outputs x 4 bytes.
grep -q "evaluation's fp32 copy" dry.log && fail "classification: an fp32 copy of the outputs counted"
"$HPCTRAIN" data generate regression --samples 256 --outputs 3 --seed 1 --output reg-train.h5 >/dev/null
"$HPCTRAIN" data generate regression --samples 64 --outputs 3 --seed 2 --output reg-validation.h5 >/dev/null
cat >reg.toml <<'TOML'
[data]
train = "reg-train.h5"
validation = "reg-validation.h5"
batch_size = 32
eval_batch_size = 32
[model]
loss = "mse"
layers = [ { type = "linear", out = 8 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 4
TOML
run_ranks 2 train reg.toml --output dry --dry-run >reg.log 2>&1 || { cat reg.log >&2; fail "regression dry run"; }
grep -qE "evaluation's fp32 copy of the outputs .*\($((16 * 3 * 4)) bytes\)" reg.log &&
  pass "regression: the fp32 copy of an evaluation batch's outputs counted" ||
  { cat reg.log >&2; fail "regression: the evaluation copy"; }

# the same errors as train, once, on every rank
same_error() {  # NAME ARGS...: train and train --dry-run fail with the same message
  local name=$1; shift
  run_ranks 2 train deck.toml --output "err-$name" "$@" >"$name-train.log" 2>&1 && fail "$name: train passed"
  run_ranks 2 train deck.toml --output "err-$name" --dry-run "$@" >"$name-dry.log" 2>&1 && fail "$name: dry run passed"
  local train_error dry_error
  train_error=$(grep "hpctrain: error:" "$name-train.log" || true)
  dry_error=$(grep "hpctrain: error:" "$name-dry.log" || true)
  [[ -n "$dry_error" && "$dry_error" == "$train_error" && $(grep -c "hpctrain: error:" "$name-dry.log") == 1 ]] &&
    pass "$name: $dry_error" || { cat "$name-train.log" "$name-dry.log" >&2; fail "$name: errors differ"; }
}
same_error missing_data --set data.train=missing.h5
same_error batch_over_ranks --set data.batch_size=63
same_error classes --set 'model.layers[4].out=2'

# a run it would resume: said, and left as it was
run_ranks 2 train deck.toml --output run --set train.epochs=1 >run.log 2>&1 || { cat run.log >&2; fail "short run"; }
before=$(find run -printf '%p %s %T@\n' | sort)
run_ranks 2 train deck.toml --output run --resume auto --dry-run >resume.log 2>&1 || { cat resume.log >&2; fail "resume"; }
grep -q "start: resume from run/checkpoints/step-00000016.h5 at step 16 (32 steps to go)" resume.log &&
  pass "resume: $(grep start: resume.log)" || { cat resume.log >&2; fail "resume not described"; }
[[ "$(find run -printf '%p %s %T@\n' | sort)" == "$before" ]] && pass "the run directory is unchanged" ||
  fail "the dry run changed the run directory"
run_ranks 2 train deck.toml --output run --dry-run >refused.log 2>&1 && fail "a fresh start over a run passed" ||
  grep -q "already holds a run" refused.log && pass "a start over a run is refused as train refuses it" ||
  { cat refused.log >&2; fail "refusal"; }
finish
