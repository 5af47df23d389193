#!/usr/bin/env bash
# Bad data that only one rank reads (a NaN or a bad label in rank 1's share) ends predict, evaluate and train at once on
# every rank: one message, naming the file, the sample and rank 1, with what to do, and a non-zero exit (no hang: the
# 120 s of run_ranks is only a guard).
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 600 1
make_spirals validation.h5 600 2
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 10
log_every = 10
TOML
run_ranks 2 train deck.toml --output run >run.log 2>&1 || { cat run.log >&2; fail "training on good data"; }
# Sample 450 is in rank 1's half of 600 samples on 2 ranks (each rank checks a contiguous slice).
$PYTHON - <<'PY'
import h5py, numpy as np
def copy(source, name, edit):
    with h5py.File(source, "r") as f:
        x, y = f["/features"][()], f["/labels"][()]
    edit(x, y)
    with h5py.File(name, "w") as f:
        f["features"], f["labels"] = x, y
def nan(x, y): x[450, 1] = np.nan
def label(x, y): y[450] = 7
copy("validation.h5", "nan.h5", nan)
copy("validation.h5", "label.h5", label)
copy("train.h5", "train-nan.h5", nan)
PY

# expect_rank_error NAME PATTERN HINT ARGS...: expect_error on 2 ranks, the message naming rank 1, the hint present.
expect_rank_error() {
  local name=$1 pattern=$2 hint=$3; shift 3
  local before=$failures
  expect_error "$name" "$pattern \(found by rank 1 of 2\)" 2 "$@"
  ((failures == before)) || return 0
  grep -q -- "hint: .*$hint" "$WORK/$name.log" || { fail "$name: no hint '$hint'"; cat "$WORK/$name.log" >&2; }
}
checkpoint=run/checkpoints/latest
nan_pattern="features in '.*nan.h5' contain NaN or Inf \(first at sample 450\)"
label_pattern="label 7 of sample 450 in '.*label.h5' is outside \[0, 3\), the model's 3 outputs"
expect_rank_error predict_nan "$nan_pattern" "clean or drop those samples" predict $checkpoint --data nan.h5 \
  --output predictions.h5
[[ ! -e predictions.h5 ]] && pass "predict wrote no predictions" || fail "predict left predictions.h5"
expect_rank_error evaluate_nan "$nan_pattern" "clean or drop those samples" evaluate $checkpoint --data nan.h5
expect_rank_error evaluate_label "$label_pattern" "fix the labels" evaluate $checkpoint --data label.h5
expect_rank_error train_nan "data.train: features in '.*train-nan.h5' contain NaN or Inf \\(first at sample 450\\)" "clean or drop those samples" \
  train deck.toml --output train-nan --set data.train=train-nan.h5
expect_rank_error train_validation_label "data.validation: $label_pattern" "fix the labels" train deck.toml \
  --output train-label --set data.validation=label.h5
finish
