#!/usr/bin/env bash
# Standardisation: `data inspect --stats-out` writes the per-channel mean and std (fp64) that NumPy computes; a deck's
# data.normalize applies (x - mean) / std exactly as standardising the file by hand does (identical training losses);
# config.toml and the checkpoints carry the values, so predict and evaluate on a checkpoint agree without the file;
# data.mean/data.std in the deck do the same; inspect prints regression targets' statistics; bad statistics (missing
# file, another number of channels, std 0, lengths that differ) are refused with one message naming the file or key;
# images stored channels-last get a start-up hint.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
# Images (N, 3, 4, 4) whose channels differ by orders of magnitude; labels from the standardised values, channel 2
# of sample 0.. constant in const.h5.
$PYTHON - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(7)
offsets = np.array([100.0, -5.0, 0.01]).reshape(1, 3, 1, 1)
scales = np.array([50.0, 0.1, 1.0]).reshape(1, 3, 1, 1)
w = rng.normal(size=(3 * 16, 3))
for name, n in (("train", 1024), ("validation", 300)):
    z = rng.normal(size=(n, 3, 4, 4))
    with h5py.File(f"{name}.h5", "w") as f:
        f["/features"] = (z * scales + offsets).astype(np.float32)
        f["/labels"] = np.argmax(z.reshape(n, -1) @ w, axis=1).astype(np.int32)
with h5py.File("const.h5", "w") as f:
    x = (rng.normal(size=(64, 3, 2, 2)) * 3 + 1).astype(np.float32)
    x[:, 2] = 7.0
    f["/features"] = x
    f["/labels"] = np.zeros(64, dtype=np.int32)
with h5py.File("two.h5", "w") as f:
    f["/features"] = rng.normal(size=(64, 2, 4, 4)).astype(np.float32)
    f["/labels"] = np.zeros(64, dtype=np.int32)
with h5py.File("regression.h5", "w") as f:
    f["/features"] = rng.normal(size=(200, 4)).astype(np.float32)
    f["/targets"] = (rng.normal(size=(200, 2)) * [3.0, 0.5] + [10.0, -1.0]).astype(np.float32)
PY

run_ranks 1 data inspect train.h5 --stats-out stats.h5 >inspect.log 2>&1 || { cat inspect.log >&2; fail "inspect"; }
grep -q "wrote the mean and std of 3 channels" inspect.log && pass "inspect --stats-out: $(grep wrote inspect.log)" ||
  { cat inspect.log >&2; fail "inspect --stats-out says what it wrote"; }
$PYTHON - <<'PY' && pass "stats.h5 holds NumPy's fp64 per-channel mean and population std" || fail "stats.h5 values"
import h5py, numpy as np
x = h5py.File("train.h5", "r")["/features"][()].astype(np.float64)
s = h5py.File("stats.h5", "r")
mean, std = x.mean(axis=(0, 2, 3)), x.std(axis=(0, 2, 3))
assert s["/mean"].dtype == np.float64 and s["/mean"].shape == (3,) and s["/std"].shape == (3,)
assert np.all(s["/count"][()] == x.shape[0] * 16)
assert np.max(np.abs(s["/mean"][()] - mean) / std) < 1e-12, (s["/mean"][()], mean)
assert np.max(np.abs(s["/std"][()] / std - 1)) < 1e-12, (s["/std"][()], std)
assert s.attrs["source"] == "train.h5" and s.attrs["features"] == "/features"
PY
expect_error stats-out-exists "already exists" 1 data inspect train.h5 --stats-out stats.h5
run_ranks 1 data inspect const.h5 --stats-out const-stats.h5 >const.log 2>&1 &&
  grep -q "1 constant channel" const.log && $PYTHON -c "
import h5py; s = h5py.File('const-stats.h5', 'r'); assert s['/std'][2] == 1.0 and s['/mean'][2] == 7.0" &&
  pass "a constant channel is written with std 1: $(grep note const.log)" || { cat const.log >&2; fail "constant channel"; }
run_ranks 1 data inspect regression.h5 >regression.log 2>&1 || { cat regression.log >&2; fail "inspect regression"; }
$PYTHON - <<'PY' && pass "inspect prints the regression targets' mean and std per column" || { cat regression.log >&2; fail "targets"; }
import h5py, numpy as np, re
t = h5py.File("regression.h5", "r")["/targets"][()].astype(np.float64)
text = open("regression.log").read()
assert "targets (/targets, float32): 2," in text, text
rows = [l.split() for l in text.splitlines() if re.match(r"\s+[01]\s+-?\d", l)]
rows = rows[-2:]  # the two target columns come after the four feature channels
for column, row in enumerate(rows):
    assert abs(float(row[3]) - t[:, column].mean()) < 1e-5 * abs(t[:, column].mean()), (row, t[:, column].mean())
    assert abs(float(row[4]) - t[:, column].std()) < 1e-5 * t[:, column].std(), (row, t[:, column].std())
PY

# Training with data.normalize against training on data standardised by hand (fp32 as the reader does it).
$PYTHON - <<'PY'
import h5py, numpy as np
s = h5py.File("stats.h5", "r")
mean = s["/mean"][()].astype(np.float32).reshape(1, 3, 1, 1)
std = s["/std"][()].astype(np.float32).reshape(1, 3, 1, 1)
for name in ("train", "validation"):
    with h5py.File(f"{name}.h5", "r") as source, h5py.File(f"{name}-standard.h5", "w") as out:
        out["/features"] = (source["/features"][()] - mean) / std
        out["/labels"] = source["/labels"][()]
PY
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
normalize = "stats.h5"
batch_size = 32
[model]
layers = [ { type = "flatten" }, { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
[train]
steps = 120
log_every = 10
TOML
run_ranks 2 train deck.toml --output normalized >normalized.log 2>&1 || { cat normalized.log >&2; fail "normalized run"; }
run_ranks 2 train deck.toml --output by-hand --set data.normalize= --set data.train=train-standard.h5 \
  --set data.validation=validation-standard.h5 >by-hand.log 2>&1 || { cat by-hand.log >&2; fail "by-hand run"; }
run_ranks 1 train deck.toml --output one-rank >one-rank.log 2>&1 || { cat one-rank.log >&2; fail "one-rank run"; }
$PYTHON - <<'PY' && pass "data.normalize trains exactly as data standardised by hand, on 1 and 2 ranks" || fail "normalize"
import h5py, numpy as np
a, b, c = (h5py.File(f"{run}/metrics.h5", "r") for run in ("normalized", "by-hand", "one-rank"))
la, lb, lc = a["/train/loss"][()], b["/train/loss"][()], c["/train/loss"][()]
print("losses", la[:3], "...", la[-1], "accuracy", a["/eval/accuracy"][-1])
assert np.all(np.isfinite(la)) and len(la) >= 12, len(la)
assert np.array_equal(la, lb), (la, lb)
assert np.max(np.abs(la - lc) / np.abs(lb)) < 1e-5, (la, lc)
assert a["/eval/accuracy"][-1] > 0.6, "the model did not learn: the comparison would prove little"
PY
grep -q '^normalize = ""' normalized/config.toml && grep -q '^mean = \[' normalized/config.toml &&
  grep -q '^std = \[' normalized/config.toml && pass "config.toml records the values: $(grep '^mean' normalized/config.toml)" ||
  { cat normalized/config.toml >&2; fail "config.toml records data.mean/data.std"; }

# predict and evaluate on the checkpoint, with the statistics file gone: the checkpoint carries the values.
mv stats.h5 stats-moved.h5
run_ranks 2 predict normalized --data validation.h5 --output predictions.h5 >predict.log 2>&1 ||
  { cat predict.log >&2; fail "predict"; }
run_ranks 2 evaluate normalized --data validation.h5 --output evaluation.h5 >evaluate.log 2>&1 ||
  { cat evaluate.log >&2; fail "evaluate"; }
$PYTHON - <<'PY' && pass "predict on the normalised checkpoint reproduces evaluate and the run's accuracy" || fail "predict"
import h5py, numpy as np
labels = h5py.File("validation.h5", "r")["/labels"][()]
accuracy = np.mean(h5py.File("predictions.h5", "r")["/classes"][()] == labels)
evaluated = h5py.File("evaluation.h5", "r")["/eval/accuracy"][0]
trained = h5py.File("normalized/metrics.h5", "r")["/eval/accuracy"][-1]
print(f"predict {accuracy:.4f}, evaluate {evaluated:.4f}, run {trained:.4f}")
assert accuracy == evaluated == trained
PY
mv stats-moved.h5 stats.h5

# The values in the deck instead of a file: the same run.
values=$($PYTHON -c "
import h5py; s = h5py.File('stats.h5', 'r')
print('--set data.mean=[' + ','.join(repr(float(v)) for v in s['/mean']) + '] --set data.std=[' +
      ','.join(repr(float(v)) for v in s['/std']) + ']')")
# shellcheck disable=SC2086
run_ranks 2 train deck.toml --output in-deck --set data.normalize= $values >in-deck.log 2>&1 ||
  { cat in-deck.log >&2; fail "in-deck run"; }
$PYTHON -c "
import h5py, numpy as np
a, b = (h5py.File(f'{r}/metrics.h5', 'r')['/train/loss'][()] for r in ('normalized', 'in-deck'))
assert np.array_equal(a, b)" && pass "data.mean/data.std in the deck train as data.normalize does" ||
  fail "data.mean/data.std"

# Bad statistics: one message, naming the file or key.
expect_error missing-file "data.normalize = \"absent.h5\".*absent.h5" 2 train deck.toml --output e1 \
  --set data.normalize=absent.h5
run_ranks 1 data inspect two.h5 --stats-out two-stats.h5 >/dev/null 2>&1
expect_error wrong-channels "data.normalize = \"two-stats.h5\" has 2 values .* have 3 channels" 2 train deck.toml \
  --output e2 --set data.normalize=two-stats.h5
expect_error zero-std "data.std\[1\] is 0" 2 train deck.toml --output e3 --set data.normalize= \
  --set "data.mean=[1,2,3]" --set "data.std=[1,0,1]"
expect_error lengths "data.mean has 2 values but data.std has 3" 2 train deck.toml --output e4 --set data.normalize= \
  --set "data.mean=[1,2]" --set "data.std=[1,1,1]"
expect_error both "data.normalize and data.mean/data.std are both set" 2 train deck.toml --output e5 \
  --set "data.mean=[1,2,3]" --set "data.std=[1,1,1]"
$PYTHON -c "
import h5py, numpy as np
with h5py.File('bad-stats.h5', 'w') as f:
    f['/mean'] = np.zeros(3); f['/std'] = np.array([1.0, 0.0, 1.0])"
expect_error zero-std-file "bad-stats.h5.*channel 1 has mean 0 and std 0" 2 train deck.toml --output e6 \
  --set data.normalize=bad-stats.h5

# A hint when images look channels-last: (N, 8, 8, 3) warns once, naming the file and np.moveaxis; (N, 3, 8, 8) does
# not.
$PYTHON - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(3)
x = rng.normal(size=(64, 8, 8, 3)).astype(np.float32)
for name, features in (("last.h5", x), ("first.h5", np.moveaxis(x, -1, 1))):
    with h5py.File(name, "w") as f:
        f["/features"] = features
        f["/labels"] = rng.integers(0, 3, size=64).astype(np.int32)
PY
for layout in last first; do
  run_ranks 2 train deck.toml --output hint-$layout --set data.train=$layout.h5 --set data.validation=$layout.h5 \
    --set data.normalize= --set train.steps=2 >hint-$layout.log 2>&1 || { cat hint-$layout.log >&2; fail "$layout"; }
done
if [[ $(grep -c "look stored channels-last" hint-last.log) == 1 ]] && grep -q "last.h5.*(8, 8, 3).*np.moveaxis" hint-last.log &&
  ! grep -q "channels-last" hint-first.log; then
  pass "channels-last hint: $(grep channels-last hint-last.log)"
else
  cat hint-last.log hint-first.log >&2; fail "channels-last hint"
fi
finish
