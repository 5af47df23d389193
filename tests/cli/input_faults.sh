#!/usr/bin/env bash
# Faults in what a run reads, each with one clear message and the right exit status, nothing hanging and nothing
# read wrong: fractional class labels, data files truncated while training (memory-mapped and through HDF5), named
# pipes as deck or data, products of deck integers that overflow, train/validation shapes that differ, an empty
# --output, and the exit status of `checkpoint verify` and `report` on things that do not exist.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 512 1
make_spirals val.h5 128 2
cat >good.toml <<'TOML'
[data]
train = "train.h5"
validation = "val.h5"
batch_size = 32
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 5
TOML

# Fractional class labels are refused (not truncated), naming the file, the dataset and the first sample.
$PYTHON - <<'PY'
import h5py, numpy as np
with h5py.File("train.h5", "r") as f:
    x, y = f["/features"][()], f["/labels"][()]
labels = y.astype(np.float64)
labels[37] = 1.5
with h5py.File("fractional.h5", "w") as f:
    f["/features"], f["/labels"] = x, labels
whole = y.astype(np.float32)  # whole numbers stored as floats are fine
with h5py.File("float_labels.h5", "w") as f:
    f["/features"], f["/labels"] = x, whole
with h5py.File("wide_val.h5", "w") as f:
    f["/features"], f["/labels"] = np.zeros((64, 5), np.float32) + 0.5, y[:64]
PY
expect_error fractional_labels "labels '/labels' in '.*fractional.h5' are not whole numbers: sample 37 has label 1.5" 2 \
  train good.toml --output fractional --set data.train=fractional.h5
run_ranks 2 train good.toml --output float_labels --set data.train=float_labels.h5 >float.log 2>&1 &&
  pass "labels stored as whole floating-point numbers train" || { cat float.log >&2; fail "float labels refused"; }

# Train/validation shapes that differ: both files named.
expect_error validation_shape "validation samples in '.*wide_val.h5' have shape \(5\).*but training samples in '.*train.h5'" 2 \
  train good.toml --output shapes --set data.validation=wide_val.h5

# Named pipes as deck or data file: refused at once instead of blocking.
mkfifo deck.fifo data.fifo
expect_error fifo_deck "input deck 'deck.fifo' is a named pipe" 2 train deck.fifo
expect_error fifo_data "data file '.*data.fifo' is a named pipe" 2 train good.toml --output fifo --set data.train=data.fifo

# Deck integers whose products overflow: refused with the limit.
expect_error epochs_overflow "train.epochs must be <= 2147483647" 2 train good.toml --output big \
  --set train.steps=0 --set train.epochs=1000000000000000000
expect_error epochs_times_steps "train.epochs = 1000000000 x 16 steps per epoch is more than the 2147483647 steps" 2 \
  train good.toml --output big --set train.steps=0 --set train.epochs=1000000000

# --output "" names --output.
expect_error empty_output "hpctrain train: --output needs a directory, got an empty string" 2 \
  train good.toml --output ""

# Bad input to checkpoint verify and report is exit status 2.
for command in "checkpoint verify missing.h5" "report runs/nonexistent"; do
  status=0
  # shellcheck disable=SC2086
  "$HPCTRAIN" $command >"$WORK/verify.log" 2>&1 || status=$?
  ((status == 2)) && pass "hpctrain $command: exit status 2" || { cat "$WORK/verify.log" >&2; fail "hpctrain $command: exit $status"; }
done

# A data file truncated while training: one message naming the file, exit 2, no bus error or backtrace; with the
# memory-mapped reader and with HDF5's (which would read zeros past the end).
"$HPCTRAIN" data generate spirals --samples 200000 --classes 3 --seed 3 --output big.h5 >/dev/null
for direct in 1 0; do
  cp big.h5 "shrinking-$direct.h5"
  status=0
  HPCTRAIN_HDF5_DIRECT=$direct timeout 120 $MPIEXEC -n 2 "$HPCTRAIN" train good.toml --output "shrink-$direct" \
    --set data.train="shrinking-$direct.h5" --set data.validation=\"\" --set train.steps=100000000 \
    --set train.log_every=100 >"shrink-$direct.log" 2>&1 &
  launcher=$!
  wait_until 120 grep -q "^step " "shrink-$direct.log" || fail "direct=$direct: training did not start"
  truncate -s 1000000 "shrinking-$direct.h5"
  wait $launcher || status=$?
  log="shrink-$direct.log"
  if ((status == 2)) && grep -q "data file '.*shrinking-$direct.h5' shrank from" "$log" &&
    ! grep -qE "Bus error|SIGBUS|backtrace|Signal: " "$log"; then
    pass "direct=$direct: $(grep -m1 'shrank from' "$log")"
  else
    cat "$log" >&2
    fail "direct=$direct: a truncated data file gave exit $status"
  fi
done
finish
