#!/usr/bin/env bash
# model.class_weights and model.label_smoothing (PyTorch's CrossEntropyLoss(weight, label_smoothing)): the training
# losses of a weighted, smoothed run agree on 1 rank and on 2 ranks with 2 micro-batches each to 1e-5 relative, because the mean
# divides by the global batch's sum of its labels' weights; they differ from the unweighted run's; the validation loss
# is the same formula evaluated in NumPy on predict's logits; bad values, a wrong length and a changed key on resume
# are refused.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 2048 1
make_spirals validation.h5 300 2
cat >deck.toml <<'TOML'
[run]
seed = 3
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 32 }, { type = "tanh" }, { type = "linear", out = 3 } ]
class_weights = [0.5, 2.0, 1.25]
label_smoothing = 0.1
[optimizer]
type = "sgd"
lr = 0.05
[train]
steps = 20
log_every = 10
TOML
run_ranks 1 train deck.toml --output w1 >w1.log 2>&1 || { cat w1.log >&2; fail "weighted, 1 rank"; }
run_ranks 2 train deck.toml --output w2 --set train.accumulate=2 >w2.log 2>&1 ||
  { cat w2.log >&2; fail "weighted, 2 ranks, accumulate 2"; }
grep -q "loss: cross-entropy with class weights \[0.5, 2, 1.25\] and label smoothing 0.1" w2.log &&
  pass "the model summary names the class weights and the smoothing" || { cat w2.log >&2; fail "summary"; }
run_ranks 1 train deck.toml --output plain --set model.class_weights=[] --set model.label_smoothing=0 >plain.log 2>&1 ||
  { cat plain.log >&2; fail "unweighted"; }
run_ranks 1 predict w1/checkpoints/step-00000020.h5 --data validation.h5 --output predictions.h5 >predict.log 2>&1 ||
  { cat predict.log >&2; fail "predict"; }
$PYTHON - <<'PY' && pass "weighted + smoothed losses agree on 1 and 2 ranks, differ from unweighted; eval loss matches" ||
import h5py, numpy as np
loss = {run: h5py.File(f"{run}/metrics.h5", "r")["/train/loss"][()] for run in ("w1", "w2", "plain")}
for run in ("w2",):
    rel = np.max(np.abs(loss[run] - loss["w1"]) / np.abs(loss["w1"]))
    print(f"{run}: largest relative loss difference to 1 rank over {len(loss[run])} steps: {rel:.2e}")
    assert len(loss[run]) == 20 and np.all(np.isfinite(loss[run])) and rel < 1e-5, rel
differs = np.abs(loss["plain"] - loss["w1"]) / np.abs(loss["w1"])
print(f"relative difference to the unweighted run: {differs[0]:.2e} at step 1, {differs[-1]:.2e} at step 20")
assert differs[-1] > 1e-2, differs
# The validation loss of the last step: the documented formula on predict's logits of the same checkpoint.
logits = h5py.File("predictions.h5", "r")["/predictions"][()].astype(np.float64)
labels = h5py.File("validation.h5", "r")["/labels"][()]
w, eps, classes = np.array([0.5, 2.0, 1.25]), 0.1, 3
shifted = logits - logits.max(axis=1, keepdims=True)
nll = np.log(np.exp(shifted).sum(axis=1, keepdims=True)) - shifted  # -log p_k, (N, C)
rows = np.arange(len(labels))
per_sample = (1 - eps) * w[labels] * nll[rows, labels] + eps / classes * (nll * w).sum(axis=1)
want = per_sample.sum() / w[labels].sum()
got = h5py.File("w1/metrics.h5", "r")["/eval/loss"][-1]
print(f"validation loss {got:.8f}, formula on predict's logits {want:.8f}")
assert abs(got - want) < 1e-5 * want, (got, want)
PY
  fail "weighted losses"

expect_error class_weights_length "model.class_weights has 2 values but the model has 3 outputs" 2 \
  train deck.toml --output bad1 --set model.class_weights=[1,2]
expect_error class_weights_zero "model.class_weights\[1\] is 0(\.0)?: a class weight must be a positive" 1 \
  train deck.toml --output bad2 --set model.class_weights=[1,0,2]
expect_error label_smoothing_range "model.label_smoothing must be in \[0, 1\)" 1 \
  train deck.toml --output bad3 --set model.label_smoothing=1
expect_error class_weights_mse "model.class_weights is set but model.loss = \"mse\"" 1 \
  train deck.toml --output bad4 --set model.loss=mse

# Resuming with another label_smoothing is refused, and allowed when --allow-changed names it.
run_ranks 1 train deck.toml --output w1 --set train.steps=25 --set model.label_smoothing=0.2 --resume auto \
  >changed.log 2>&1 && fail "resume with changed label_smoothing: accepted" ||
  { grep -q "model.label_smoothing 0.1 -> 0.2" changed.log && pass "resume with changed label_smoothing refused" ||
    { cat changed.log >&2; fail "resume with changed label_smoothing: wrong message"; }; }
run_ranks 1 train deck.toml --output w1 --set train.steps=25 --set model.label_smoothing=0.2 --resume auto \
  --allow-changed model.label_smoothing >allowed.log 2>&1 && grep -q "model.label_smoothing 0.1 -> 0.2" allowed.log &&
  pass "resume with --allow-changed model.label_smoothing" || { cat allowed.log >&2; fail "--allow-changed"; }
finish
