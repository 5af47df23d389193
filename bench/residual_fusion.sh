#!/usr/bin/env bash
# bench/residual_fusion.sh: the residual add fused into the branch's last product (issue 16) against the separate add
# (HPCTRAIN_FUSE_RESIDUAL=0), side by side: inputs/gpt-tiny.toml (2 transformer_blocks, C = 64, T = 64, batch 16) on
# 1 rank, 1 thread, fp32 and bf16, in alternating rounds so that load from elsewhere hits both. A run's figure is the
# median of /train/samples_per_sec over the steps after the warm-up; a row's is the median over the rounds.
#
#   bench/residual_fusion.sh [BUILD_DIR] [ROUNDS] [STEPS]     defaults: build/release 5 150
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build/release}" && pwd)
ROUNDS=${2:-5}
STEPS=${3:-150}
WARMUP=20
HPCTRAIN=$BUILD/bin/hpctrain
[[ -x $HPCTRAIN ]] || { echo "residual_fusion: no $HPCTRAIN (build first)" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-residual-fusion.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
"$HPCTRAIN" data convert --text /usr/share/common-licenses/GPL-3 --validation-fraction 0.1 --sequence-length 64 \
  --output gpl3-train.h5 --validation-output gpl3-validation.h5 >/dev/null
cp "$ROOT/inputs/gpt-tiny.toml" .
for round in $(seq 1 "$ROUNDS"); do
  for precision in fp32 bf16; do
    for fuse in 1 0; do
      HPCTRAIN_FUSE_RESIDUAL=$fuse OMP_NUM_THREADS=1 "$HPCTRAIN" train gpt-tiny.toml --output "run-$precision-$fuse-$round" \
        --set data.train='"gpl3-train.h5"' --set 'data.validation=""' --set train.steps="$STEPS" \
        --set train.log_every=1 --set train.eval_every=0 \
        --set precision.mode="$precision" >"run-$precision-$fuse-$round.log" 2>&1 ||
        { cat "run-$precision-$fuse-$round.log" >&2; exit 1; }
    done
  done
done
/usr/bin/python3 - "$ROUNDS" "$WARMUP" <<'PY'
import sys, h5py, numpy as np
rounds, warmup = int(sys.argv[1]), int(sys.argv[2])
print(f"gpt-tiny, 1 rank x 1 thread, median samples/s over {rounds} alternating rounds (load: {open('/proc/loadavg').read().split()[0]})")
print("| precision | fused | separate add | fused / separate |")
print("|---|---|---|---|")
for precision in ("fp32", "bf16"):
    medians = {}
    for fuse in ("1", "0"):
        per_run = []
        for r in range(1, rounds + 1):
            with h5py.File(f"run-{precision}-{fuse}-{r}/metrics.h5", "r") as f:
                per_run.append(float(np.median(f["/train/samples_per_sec"][warmup:])))
        medians[fuse] = float(np.median(per_run))
    print(f"| {precision} | {medians['1']:.0f} | {medians['0']:.0f} | {medians['1'] / medians['0']:.3f} |")
PY
