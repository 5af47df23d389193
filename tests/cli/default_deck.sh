#!/usr/bin/env bash
# The default deck (inputs/default.toml, as README command 1 runs it) on 2 ranks: fp32 reaches >= 0.95 validation
# accuracy, and bf16 and fp16 (with dynamic loss scaling) land within 1 percentage point of fp32.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
mkdir data
make_spirals data/spirals-train.h5 20000 1
make_spirals data/spirals-validation.h5 4000 2
cp "$HPCTRAIN_SOURCE_DIR/inputs/default.toml" .
for mode in fp32 bf16 fp16; do
  run_ranks 2 train default.toml --output run-$mode --set precision.mode=$mode >run-$mode.log 2>&1 ||
    { cat run-$mode.log >&2; fail "default deck in $mode failed"; }
  tail -n 2 run-$mode.log
done
$PYTHON - <<'PY' || fail "accuracy goals missed"
import h5py
accuracy = {m: h5py.File(f"run-{m}/metrics.h5", "r")["/eval/accuracy"][-1] for m in ("fp32", "bf16", "fp16")}
print("final validation accuracy:", {m: round(float(a), 4) for m, a in accuracy.items()})
assert accuracy["fp32"] >= 0.95, accuracy
for m in ("bf16", "fp16"):
    assert abs(accuracy[m] - accuracy["fp32"]) <= 0.01, (m, accuracy)
scale = h5py.File("run-fp16/metrics.h5", "r")["/train/loss_scale"][:]
assert scale[0] == 65536.0, scale[0]
PY
finish
