#!/usr/bin/env bash
# Generated data: --seed draws the samples and --problem-seed the problem, so a model trained on --seed 1 data
# predicts --seed 2 data of the same problem (blobs: accuracy far above chance; regression: R^2 > 0), while data of
# another --problem-seed is another problem (the check that the first one can fail).
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"

generate() { "$HPCTRAIN" data generate "$@" >/dev/null || fail "data generate $*"; }
generate blobs --samples 2000 --features 4 --classes 5 --seed 1 --output blobs-train.h5
generate blobs --samples 500 --features 4 --classes 5 --seed 2 --output blobs-validation.h5
generate blobs --samples 500 --features 4 --classes 5 --seed 2 --problem-seed 7 --output blobs-other.h5
generate regression --samples 4000 --features 4 --seed 1 --output regression-train.h5
generate regression --samples 1000 --features 4 --seed 2 --output regression-validation.h5
generate regression --samples 1000 --features 4 --seed 2 --problem-seed 7 --output regression-other.h5

cat >deck.toml <<'TOML'
[data]
batch_size = 100
[model]
layers = [ { type = "linear", out = 64 }, { type = "relu" }, { type = "linear", out = 64 }, { type = "relu" },
           { type = "linear", out = 5 } ]
[optimizer]
lr = 0.003
[train]
steps = 300
log_every = 100
TOML
train() {  # NAME TRAIN VALIDATION [--set ...]
  local name=$1 train=$2 validation=$3; shift 3
  run_ranks 2 train deck.toml --output "$name" --set "data.train=$train" --set "data.validation=$validation" "$@" \
    >"$name.log" 2>&1 || { cat "$name.log" >&2; fail "$name: training"; }
}
train blobs blobs-train.h5 blobs-validation.h5
train blobs-other blobs-train.h5 blobs-other.h5
train regression regression-train.h5 regression-validation.h5 --set model.loss=mse --set 'model.layers[4].out=1'
train regression-other regression-train.h5 regression-other.h5 --set model.loss=mse --set 'model.layers[4].out=1'

$PYTHON - <<'PY' && pass "seed 1 -> seed 2: same problem; another --problem-seed: another problem" || fail "problem seeds"
import h5py
def last(run, key):
    return float(h5py.File(f"{run}/metrics.h5", "r")[f"/eval/{key}"][-1])
def root(path, key):
    return int(h5py.File(path, "r").attrs[key])
same, other = last("blobs", "accuracy"), last("blobs-other", "accuracy")
r2_same, r2_other = last("regression", "r2"), last("regression-other", "r2")
print(f"blobs validation accuracy {same:.3f} (another problem {other:.3f}, chance 0.2); "
      f"regression validation R^2 {r2_same:.3f} (another problem {r2_other:.3f})")
assert same > 0.9, same
assert other < 0.6, other
assert r2_same > 0.5, r2_same
assert r2_other < 0.2, r2_other
assert root("blobs-train.h5", "seed") == 1 and root("blobs-train.h5", "problem_seed") == 0
assert root("blobs-other.h5", "problem_seed") == 7
PY

# Samples of one problem: the seed changes the samples, not the blob centres (class means agree within noise).
$PYTHON - <<'PY' && pass "class means of --seed 1 and --seed 2 agree" || fail "class means differ"
import h5py, numpy as np
def means(path):
    f = h5py.File(path, "r")
    x, y = f["/features"][()], f["/labels"][()]
    return np.stack([x[y == c].mean(axis=0) for c in range(5)])
a, b = means("blobs-train.h5"), means("blobs-validation.h5")
assert not np.array_equal(h5py.File("blobs-train.h5")["/features"][:500], h5py.File("blobs-validation.h5")["/features"][()])
print(f"largest class-mean difference {np.abs(a - b).max():.3f} (noise std 1)")
assert np.abs(a - b).max() < 0.5
PY
finish
