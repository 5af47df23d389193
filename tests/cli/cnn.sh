#!/usr/bin/env bash
# Convolutional networks end to end: the 2-D example deck (inputs/cnn2d.toml as it is: 8000 images, 4 epochs, ~10 s)
# reaches >= 95% validation accuracy on 2 ranks, and evaluate/predict reproduce it; 1 and 2 ranks give the same
# losses; the channels-last and channels-first conv stacks give the same losses; a resumed bf16 run is bit-identical to an uninterrupted one; the small CosmoFlow deck's loss falls; PyTorch
# loads both checkpoints and reproduces their validation figures (when torch is installed); the full-size CosmoFlow
# deck shape-checks; impossible shapes and conv keys fail with one clear message.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
mkdir data
"$HPCTRAIN" data generate images --samples 8000 --seed 1 --output data/images-train.h5 >/dev/null
"$HPCTRAIN" data generate images --samples 2000 --seed 2 --output data/images-validation.h5 >/dev/null
make_spirals data/flat.h5 256
cp "$HPCTRAIN_SOURCE_DIR"/inputs/{cnn2d,cosmoflow-small,cosmoflow}.toml .

# 1. accuracy
run_ranks 2 train cnn2d.toml --output run-accuracy >accuracy.log 2>&1 ||
  { cat accuracy.log >&2; fail "cnn2d on 2 ranks"; }
grep -q "(N, 16, 4, 4)" accuracy.log && pass "summary prints conv output shapes" || fail "no shapes in the summary"
$PYTHON - <<'PY' || fail "cnn2d accuracy below 0.95"
import h5py
accuracy = float(h5py.File("run-accuracy/metrics.h5", "r")["/eval/accuracy"][-1])
print(f"cnn2d validation accuracy: {accuracy:.4f}")
assert accuracy >= 0.95, accuracy
PY

# 1b. evaluate and predict read image data with the checkpoint's conv model and reproduce the run's accuracy
checkpoint=$(ls run-accuracy/checkpoints/step-*.h5 | tail -n 1)
run_ranks 2 evaluate "$checkpoint" --data data/images-validation.h5 >evaluate.log 2>&1 ||
  { cat evaluate.log >&2; fail "evaluate on a cnn2d checkpoint"; }
run_ranks 2 predict "$checkpoint" --data data/images-validation.h5 --output predictions.h5 >predict.log 2>&1 ||
  { cat predict.log >&2; fail "predict on a cnn2d checkpoint"; }
$PYTHON - <<'PY' || fail "evaluate/predict differ from the training run's evaluation"
import re, h5py, numpy as np
trained = float(h5py.File("run-accuracy/metrics.h5", "r")["/eval/accuracy"][-1])
printed = float(re.search(r"accuracy ([0-9.]+)", open("evaluate.log").read()).group(1))
with h5py.File("predictions.h5", "r") as p, h5py.File("data/images-validation.h5", "r") as d:
    key = [k for k in p.keys() if k in ("predictions", "labels", "classes", "logits")]
    values = p[key[0]][()]
    predicted = values.argmax(1) if values.ndim == 2 else values
    from_predictions = float(np.mean(predicted == d["labels"][()]))
print(f"accuracy: training run {trained:.4f}, evaluate {printed:.4f}, predict ({key[0]}) {from_predictions:.4f}")
assert abs(printed - trained) < 1e-4 and abs(from_predictions - trained) < 1e-4
PY

# 2. rank invariance (global batch, initial weights and data order do not depend on the rank count)
for ranks in 1 2; do
  run_ranks $ranks train cnn2d.toml --output run-ranks$ranks --set train.epochs=0 --set train.steps=30 \
    --set train.log_every=30 --set 'data.validation=""' >ranks$ranks.log 2>&1 ||
    { cat ranks$ranks.log >&2; fail "cnn2d on $ranks ranks"; }
done
$PYTHON - <<'PY' || fail "losses differ between 1 and 2 ranks"
import h5py, numpy as np
one, two = (h5py.File(f"run-ranks{r}/metrics.h5", "r")["/train/loss"][:] for r in (1, 2))
rel = np.max(np.abs(one - two) / np.abs(one))
print(f"1 vs 2 ranks, 30 steps: largest relative loss difference {rel:.2e}")
assert len(one) == len(two) == 30 and rel < 1e-4, rel
PY

# 2a. the conv stack runs channels-last on the CPU, and the file layout (HPCTRAIN_SPATIAL_LAYOUT=channels_first) gives
# the same losses to rounding (oneDNN runs other kernels for each layout)
for layout in channels_last channels_first; do
  HPCTRAIN_SPATIAL_LAYOUT=$layout run_ranks 2 train cnn2d.toml --output run-$layout --set train.epochs=0 \
    --set train.steps=30 --set train.log_every=30 --set 'data.validation=""' >$layout.log 2>&1 ||
    { cat $layout.log >&2; fail "cnn2d with $layout"; }
done
grep -q "conv layers run channels-last" channels_last.log && ! grep -q "channels-last" channels_first.log &&
  pass "the summary says which layout the conv layers run in" || fail "summary: layout line"
$PYTHON - <<'PY' || fail "losses differ between the layouts"
import h5py, numpy as np
last, first = (h5py.File(f"run-channels_{l}/metrics.h5", "r")["/train/loss"][:] for l in ("last", "first"))
rel = np.max(np.abs(last - first) / np.abs(first))
print(f"channels-last vs channels-first, 30 steps: largest relative loss difference {rel:.2e}")
assert len(last) == len(first) == 30 and np.all(np.isfinite(last)) and rel < 1e-3, rel
PY

# 2b. exact resume of a conv model (bf16, 2 ranks): interrupted at step 20 and resumed, it ends at step 40 with the
# same parameters and optimizer state, bit for bit, as the uninterrupted run
common=(--set train.epochs=0 --set train.log_every=20 --set 'data.validation=""' --set precision.mode=bf16)
run_ranks 2 train cnn2d.toml --output resume-full "${common[@]}" --set train.steps=40 >/dev/null 2>&1 || fail "resume: full run"
run_ranks 2 train cnn2d.toml --output resume-part "${common[@]}" --set train.steps=20 >/dev/null 2>&1 || fail "resume: first half"
run_ranks 2 train cnn2d.toml --output resume-part "${common[@]}" --set train.steps=40 --resume auto >resume.log 2>&1 ||
  { cat resume.log >&2; fail "resume: second half"; }
$PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" resume-full/checkpoints/step-00000040.h5 \
  resume-part/checkpoints/step-00000040.h5 &&
  pass "cnn2d bf16: exact resume" || fail "cnn2d: resumed state differs"

# 3. the small CosmoFlow deck learns (a short run on few volumes)
"$HPCTRAIN" data generate volumes --samples 256 --size 16 --channels 2 --seed 1 --output data/volumes-train.h5 >/dev/null
"$HPCTRAIN" data generate volumes --samples 64 --size 16 --channels 2 --seed 2 --output data/volumes-validation.h5 >/dev/null
run_ranks 2 train cosmoflow-small.toml --output run-cosmo --set train.epochs=5 --set train.log_every=8 >cosmo.log 2>&1 ||
  { cat cosmo.log >&2; fail "cosmoflow-small on 2 ranks"; }
$PYTHON - <<'PY' || fail "cosmoflow-small did not learn"
import h5py, numpy as np
f = h5py.File("run-cosmo/metrics.h5", "r")
loss, mse = f["/train/loss"][:], float(f["/eval/loss"][-1])
print(f"cosmoflow-small: first loss {loss[0]:.4f}, last {loss[-1]:.4f}, validation mse {mse:.4f}")
assert np.all(np.isfinite(loss)) and mse < 0.25, mse  # 0.33 = predicting 0
PY

# 3b. PyTorch reads the checkpoints with the loader of docs/file-formats.md and reproduces hpctrain's validation
# figures (same conv, pooling and layout semantics), where torch is installed
if $PYTHON -c 'import torch' 2>/dev/null; then
  $PYTHON - "$HPCTRAIN_SOURCE_DIR/docs/file-formats.md" <<'PY' || fail "PyTorch does not reproduce the validation figures"
import glob, sys, h5py, torch
doc = open(sys.argv[1]).read()
loader = doc.index("```python\nimport tomllib", doc.index("### Loading a checkpoint into PyTorch"))
exec(doc[loader + len("```python"):doc.index("model = load_hpctrain_checkpoint")])
for run, data, metric in (("run-accuracy", "images", "accuracy"), ("run-cosmo", "volumes", "loss")):
    model = load_hpctrain_checkpoint(sorted(glob.glob(f"{run}/checkpoints/step-*.h5"))[-1]).eval()
    with h5py.File(f"data/{data}-validation.h5", "r") as f:
        x = torch.from_numpy(f["features"][()])
        y = torch.from_numpy(f["labels" if data == "images" else "targets"][()])
    with torch.no_grad():
        out = model(x)
    mine = (out.argmax(1) == y).double().mean().item() if data == "images" else ((out - y) ** 2).mean().item()
    theirs = float(h5py.File(f"{run}/metrics.h5", "r")[f"/eval/{metric}"][-1])
    print(f"{run}: PyTorch {metric} {mine:.6f}, hpctrain {theirs:.6f}")
    assert abs(mine - theirs) <= 1e-4 * max(1.0, abs(theirs)), (mine, theirs)
PY
else
  echo "skipped: PyTorch cross-check (no torch for $PYTHON)"
fi

# 4. the full-size deck shape-checks at start-up: on 16^3 volumes its fifth pooling layer has nothing left to pool
expect_error cosmoflow_shape "cosmoflow.toml:[0-9]+:[0-9]+: layer 'maxpool3d14' \(maxpool3d\): its input \(N, 256, 1, 1, 1\) is too small" \
  1 train cosmoflow.toml --set data.train=data/volumes-train.h5 --set 'data.validation=""' --output run-full

# 5. shape and key errors
expect_error too_small "layer 'conv2d3' \(conv2d\): its input \(N, 8, 8, 8\) is too small on axis H" \
  2 train cnn2d.toml --set 'model.layers[3].kernel=11' --output run-bad1
expect_error groups "groups = 3 must divide both the 8 input channels" \
  2 train cnn2d.toml --set 'model.layers[3].groups=3' --output run-bad2
expect_error conv_after_flatten "cnn2d.toml: model.layers\[3\]: layer 'conv2d3' \(conv2d\) needs samples of shape \(C, H, W\), but \(N, 784\)" \
  2 train cnn2d.toml --set 'model.layers=[{type="conv2d", out=4, kernel=3}, {type="flatten"}, {type="relu"}, {type="conv2d", out=4, kernel=3}]' \
  --output run-bad3
expect_error flat_data "store the features as \(N, C, H, W\)" 2 train cnn2d.toml \
  --set data.train=data/flat.h5 --set 'data.validation=""' --output run-bad4
expect_error wrong_dimensionality "use conv3d/pooling layers of the data.s dimensionality" 2 train cnn2d.toml \
  --set data.train=data/volumes-train.h5 --set model.loss=mse --set 'data.validation=""' --output run-bad8
expect_error kernel_axes "model.layers\[0\].kernel has 3 values; a conv2d layer has 2 spatial axes" \
  2 train cnn2d.toml --set 'model.layers[0].kernel=[3, 3, 3]' --output run-bad5
expect_error pool_padding "padding \(2\) is more than half the kernel \(2\)" \
  2 train cnn2d.toml --set 'model.layers[2].padding=2' --output run-bad6
expect_error groupnorm_groups "model.layers\[1\] \(groupnorm\) needs groups" \
  2 train cnn2d.toml --set 'model.layers[1].type=groupnorm' --output run-bad7
expect_error generate_size "--size applies to images and volumes" 1 data generate blobs --samples 10 --size 8 --output x.h5
finish
