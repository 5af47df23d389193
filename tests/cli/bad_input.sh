#!/usr/bin/env bash
# Every kind of bad input gets one clear message, a non-zero exit, all ranks ending, and no output overwritten.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 512 1
make_spirals val.h5 128 2

write_deck() {  # write_deck FILE [extra TOML appended]
  cat >"$1" <<TOML
[run]
seed = 1
output = "out-${1%.toml}"
[data]
train = "train.h5"
validation = "val.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.01
[train]
steps = 5
log_every = 5
TOML
}
write_deck good.toml

# decks
expect_error missing_deck "no-such-deck.toml" 2 train no-such-deck.toml
printf '[run]\nseed = 1\n[data\nbatch_size = 3\n' >syntax.toml
expect_error toml_syntax "syntax.toml:3:" 2 train syntax.toml
write_deck unknown.toml && sed -i 's/^lr = 0.01/learning_rate = 0.01/' unknown.toml
expect_error unknown_key "unknown.toml:[0-9]+:[0-9]+: .*learning_rate.*did you mean.*optimizer.lr" 2 train unknown.toml
write_deck wrongtype.toml && sed -i 's/^batch_size = 32/batch_size = "large"/' wrongtype.toml
expect_error wrong_type "wrongtype.toml:[0-9]+:[0-9]+: .*batch_size" 2 train wrongtype.toml
write_deck range.toml && sed -i 's/^lr = 0.01/lr = -1.0/' range.toml
expect_error out_of_range "range.toml:[0-9]+:[0-9]+: .*optimizer.lr" 2 train range.toml
expect_error unknown_set_key "did you mean" 2 train good.toml --set optimizer.learning_rate=0.1
HPCTRAIN_SPATIAL_LAYOUT=nhwc expect_error bad_layout_variable "HPCTRAIN_SPATIAL_LAYOUT=nhwc is not a layout" 2 \
  train good.toml
HPCTRAIN_MPI_PROGRESS=async expect_error bad_progress_variable "HPCTRAIN_MPI_PROGRESS=async is not a progress mode" 2 \
  train good.toml
HPCTRAIN_MPI_ALLREDUCE=ring expect_error bad_allreduce_variable \
  "HPCTRAIN_MPI_ALLREDUCE=ring is not an all-reduce algorithm" 2 train good.toml
HPCTRAIN_MPI_OPTIMIZER=split expect_error bad_optimizer_variable \
  "HPCTRAIN_MPI_OPTIMIZER=split is not an optimizer layout" 2 train good.toml
HPCTRAIN_MPI_OPTIMIZER=sharded HPCTRAIN_MPI_ALLREDUCE=library expect_error sharded_with_library \
  "HPCTRAIN_MPI_OPTIMIZER=sharded needs the rank-order all-reduce" 2 train good.toml
# Rank 1 alone started with another optimizer layout: one clear error instead of a hang.
printf '#!/bin/sh\n[ "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" = 1 ] && export HPCTRAIN_MPI_OPTIMIZER=replicated\nexec "%s" "$@"\n' \
  "$HPCTRAIN" >rank1-replicated.sh
chmod +x rank1-replicated.sh
HPCTRAIN=$PWD/rank1-replicated.sh expect_error ranks_disagree \
  "the ranks were started with different HPCTRAIN_MPI_ALLREDUCE, HPCTRAIN_MPI_OPTIMIZER" 2 train good.toml
# residual blocks: a branch that changes the shape (found when the model is built), an empty branch, nesting
write_deck residual_shape.toml && sed -i 's/{ type = "relu" }/{ type = "residual", layers = [ { type = "linear", out = 8 } ] }/' residual_shape.toml
expect_error residual_shape "residual_shape.toml:[0-9]+:[0-9]+: the branch of residual block 'residual1' turns samples \(N, 16\) into \(N, 8\)" 2 \
  train residual_shape.toml
write_deck residual_empty.toml && sed -i 's/{ type = "relu" }/{ type = "residual", layers = [] }/' residual_empty.toml
expect_error residual_empty "residual_empty.toml:[0-9]+:[0-9]+: model.layers\[1\] \(residual\) has an empty branch" 2 \
  train residual_empty.toml
write_deck residual_nested.toml &&
  sed -i 's/{ type = "relu" }/{ type = "residual", layers = [ { type = "residual", layers = [ { type = "relu" } ] } ] }/' residual_nested.toml
expect_error residual_nested "residual_nested.toml:[0-9]+:[0-9]+: model.layers\[1\].layers\[0\] is a residual block inside .*not supported yet" 2 \
  train residual_nested.toml

# data files
write_deck nofile.toml && sed -i 's/^train = "train.h5"/train = "absent.h5"/' nofile.toml
expect_error missing_hdf5_file "absent.h5" 2 train nofile.toml
expect_error missing_dataset "dataset '/nolabels'" 2 train good.toml --set data.labels=/nolabels
$PYTHON - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(0)
def write(name, features, labels):
    with h5py.File(name, "w") as f:
        f["features"] = features
        f["labels"] = labels
x = rng.standard_normal((256, 2)).astype(np.float32)
y = rng.integers(0, 3, 256).astype(np.int32)
write("counts.h5", x, y[:200])
bad = y.copy(); bad[77] = 7
write("labels.h5", x, bad)
nan = x.copy(); nan[123, 1] = np.nan
write("nan.h5", nan, y)
write("small.h5", x[:20], y[:20])
write("wide.h5", rng.standard_normal((256, 5)).astype(np.float32), y)
PY
expect_error sample_counts_differ "256 samples .* but 200" 2 train good.toml --set data.train=counts.h5
expect_error label_out_of_range "label 7 of sample 77 .*outside \[0, 3\)" 2 train good.toml --set data.train=labels.h5
expect_error nan_features "NaN or Inf \(first at sample 123\)" 2 train good.toml --set data.train=nan.h5
expect_error fewer_samples_than_batch "holds only 20 samples" 2 train good.toml --set data.train=small.h5
write_deck width.toml && sed -i 's/{ type = "linear", out = 16 }/{ type = "linear", in = 2, out = 16 }/' width.toml
expect_error feature_width "expects 2 input features, but 5" 2 train width.toml --set data.train=wide.h5 --set data.validation=wide.h5
expect_error batch_not_divisible "not divisible by the 3 ranks" 3 train good.toml

# outputs
touch not-a-directory
expect_error output_not_writable "cannot create output directory" 2 train good.toml --output not-a-directory/run
run_ranks 2 train good.toml --output kept >/dev/null 2>&1 || fail "a good run failed"
before=$(md5sum kept/metrics.h5)
expect_error output_not_overwritten "already holds a run" 2 train good.toml --output kept
[[ $(md5sum kept/metrics.h5) == "$before" ]] && pass "existing metrics.h5 untouched" || fail "metrics.h5 changed"
finish
