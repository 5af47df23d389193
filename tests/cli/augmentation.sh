#!/usr/bin/env bash
# Augmentation (data.augment_flip, data.augment_crop_padding, data.augment_rot90) in a short CNN run: the losses on 1
# and 2 ranks agree (relative 1e-4; the choices are keyed by seed, epoch and global sample), they differ from the run
# without augmentation (the keys act), a run interrupted mid-epoch and resumed ends bit-identical to the uninterrupted
# one, the dry run lists the augmentation, and keys that do not fit the data are refused with one message naming the
# key.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
"$HPCTRAIN" data generate images --samples 256 --size 8 --channels 2 --classes 4 --seed 1 --output train.h5 >/dev/null
make_spirals vectors.h5 64 1
$PYTHON - <<'PY'
import h5py, numpy as np
with h5py.File("wide.h5", "w") as f:
    f["/features"] = np.random.default_rng(1).normal(size=(32, 1, 8, 12)).astype(np.float32)
    f["/labels"] = np.zeros(32, dtype=np.int32)
PY
cat >deck.toml <<'TOML'
[run]
seed = 5
[data]
train = "train.h5"
batch_size = 32
scale = 0.5
shift = 0.25
augment_flip = true
augment_crop_padding = 2
augment_rot90 = true
[model]
layers = [ { type = "conv2d", out = 6, kernel = 3, padding = 1 }, { type = "relu" }, { type = "maxpool2d", kernel = 2 },
           { type = "flatten" }, { type = "linear", out = 4 } ]
[optimizer]
lr = 0.01
[train]
steps = 24
log_every = 1
TOML

run_ranks 1 train deck.toml --output np1 >np1.log 2>&1 || { cat np1.log >&2; fail "1 rank"; }
run_ranks 2 train deck.toml --output np2 >np2.log 2>&1 || { cat np2.log >&2; fail "2 ranks"; }
run_ranks 1 train deck.toml --output plain --set data.augment_flip=false --set data.augment_crop_padding=0 \
  --set data.augment_rot90=false >plain.log 2>&1 || { cat plain.log >&2; fail "without augmentation"; }
$PYTHON - <<'PY' && pass "1 and 2 ranks agree with augmentation, which changes the run" || fail "rank invariance"
import h5py, numpy as np
loss = {name: h5py.File(f"{name}/metrics.h5", "r")["/train/loss"][:] for name in ("np1", "np2", "plain")}
assert len(loss["np1"]) == 24 and len(loss["np2"]) == 24, {k: len(v) for k, v in loss.items()}
assert np.all(np.isfinite(loss["np1"])) and np.all(np.isfinite(loss["np2"]))
rel = np.max(np.abs(loss["np2"] - loss["np1"]) / np.abs(loss["np1"]))
print(f"largest relative loss difference 1 vs 2 ranks: {rel:.2e}")
assert rel < 1e-4, rel
changed = np.max(np.abs(loss["plain"] - loss["np1"]) / np.abs(loss["plain"]))
print(f"largest relative difference to the run without augmentation: {changed:.2e}")
assert changed > 1e-3, changed
PY

# Resume mid-epoch (8 steps per epoch: step 13 is in the second), with the reader ahead by data.prefetch batches.
run_ranks 2 train deck.toml --output part --set train.steps=13 >/dev/null 2>&1 || fail "first part"
run_ranks 2 train deck.toml --output part --resume auto >part.log 2>&1 || { cat part.log >&2; fail "resume"; }
grep -q "resumed from .*step-00000013.h5 at step 13" part.log || { cat part.log >&2; fail "did not resume at step 13"; }
$PYTHON "$HPCTRAIN_SOURCE_DIR/tests/cli/lib/same_datasets.py" np2/checkpoints/step-00000024.h5 \
  part/checkpoints/step-00000024.h5 && pass "resumed mid-epoch: bit-identical to the uninterrupted run" ||
  fail "resumed state differs"

run_ranks 1 train deck.toml --dry-run >dry.log 2>&1 || { cat dry.log >&2; fail "dry run"; }
grep -q "training augmentation: random flips of every spatial axis, random crops after padding by 2, random 90-degree" \
  dry.log && pass "dry run: $(grep 'training augmentation' dry.log)" || { cat dry.log >&2; fail "dry run lists it"; }

expect_error feature-vectors "deck.toml:[0-9]+:[0-9]+: data.augment_flip augments images \(N, C, H, W\) and volumes" 1 \
  train deck.toml --output bad1 --set data.train=vectors.h5
expect_error padding-too-large \
  "data.augment_crop_padding = 8 must be smaller than the smallest spatial extent \(8\)" 1 \
  train deck.toml --output bad2 --set data.augment_crop_padding=8
expect_error rot90-not-square \
  "deck.toml:[0-9]+:[0-9]+: data.augment_rot90 rotates in the plane of the last two axes.*\(8 and 12 here\)" 1 \
  train deck.toml --output bad3 --set data.train=wide.h5 --set data.augment_crop_padding=0
finish
