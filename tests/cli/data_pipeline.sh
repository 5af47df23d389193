#!/usr/bin/env bash
# Training through the whole data pipeline: 4-D uint8 images spread over several files named by a glob, scaled on
# load; the background reader (data.prefetch) and memory staging (data.in_memory) give bit-for-bit the losses of
# synchronous reads; data.shuffle = "local" trains; 'data bench' reports a throughput per rank.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"

$PYTHON - <<'PY'
import numpy as np
rng = np.random.default_rng(2)
n = 600
labels = rng.integers(0, 3, n)
# class c brightens channel c: a learnable (N, 3, 4, 4) uint8 image set
images = rng.integers(0, 120, (n, 3, 4, 4))
images[np.arange(n), labels] += 120
np.save("images.npy", images.astype(np.uint8))
np.save("labels.npy", labels.astype(np.int32))
PY
"$HPCTRAIN" data convert --features images.npy --labels labels.npy --output all.h5 >/dev/null || fail "convert"
"$HPCTRAIN" data split all.h5 --validation-fraction 0.5 --seed 1 --train-output part_0.h5 --validation-output half.h5 \
  >/dev/null || fail "split 1"
"$HPCTRAIN" data split half.h5 --validation-fraction 0.4 --seed 2 --train-output part_1.h5 --validation-output val.h5 \
  --compress >/dev/null || fail "split 2"
cat >deck.toml <<'TOML'
[run]
seed = 3
[data]
train = "part_*.h5"
validation = "val.h5"
batch_size = 24
scale = 0.00392156862745098
shift = -0.5
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[optimizer]
lr = 0.02
[train]
epochs = 3
log_every = 100
TOML

run() {  # run NAME RANKS [--set ...]
  local name=$1 ranks=$2; shift 2
  run_ranks "$ranks" train deck.toml --output "run-$name" "$@" >"run-$name.log" 2>&1 || { cat "run-$name.log" >&2; fail "run $name"; }
}
run sync 2 --set data.prefetch=0
run prefetch 2 --set data.prefetch=3
run memory 2 --set data.in_memory=true
run local 2 --set data.shuffle=local
grep -q "data: 480 training samples, 120 validation samples" run-sync.log && pass "glob of two files: 480 samples" \
  || fail "sample counts"
$PYTHON - <<'PY' && pass "prefetch and in_memory give the synchronous losses bit for bit" || fail "losses differ"
import h5py, numpy as np
loss = {n: h5py.File(f"run-{n}/metrics.h5")["/train/loss"][:] for n in ("sync", "prefetch", "memory", "local")}
assert len(loss["sync"]) == 60, len(loss["sync"])  # 3 epochs of 480 / 24
assert np.array_equal(loss["sync"], loss["prefetch"]), "prefetch"
assert np.array_equal(loss["sync"], loss["memory"]), "in_memory"
accuracy = h5py.File("run-sync/metrics.h5")["/eval/accuracy"][-1]
print("final losses", loss["sync"][-1], loss["local"][-1], "validation accuracy", accuracy)
assert loss["sync"][-1] < 0.5 * loss["sync"][0] and loss["local"][-1] < 0.5 * loss["local"][0], "did not learn"
assert not np.array_equal(loss["sync"], loss["local"]), "local shuffle gave the global order"
PY

run_ranks 2 data bench deck.toml --steps 10 >bench.log 2>&1 \
  && grep -q "^rank 1: staging .* MB/s" bench.log && grep -q "median per-rank read throughput" bench.log \
  && pass "data bench" || { cat bench.log >&2; fail "data bench"; }
# Over 3 epochs (20 steps each) on one rank: the first epoch's and the later epochs' rates apart, the whole run's rate
# their bytes-weighted harmonic mean (1 epoch's bytes at the first rate, 2 at the later one), and the share of the
# features' map in 2 MiB entries.
run_ranks 1 data bench deck.toml --steps 60 --set data.prefetch=0 >bench3.log 2>&1 || { cat bench3.log >&2; fail "data bench, 3 epochs"; }
awk '/median per-rank read throughput/ {all = $(NF - 1)} /first-epoch throughput/ {first = $(NF - 1)}
     /later-epochs throughput/ {later = $(NF - 1)}
     /memory map of the features: .* resident, [0-9]+% of it in 2 MiB/ {
       for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9]+%$/) share = $i + 0; mapped = 1 }
     END { mean = 3 / (1 / first + 2 / later)
           exit !(first > 0 && later > 0 && all >= 0.99 * mean && all <= 1.01 * mean && mapped && share >= 0 &&
                  share <= 100) }' \
  bench3.log && pass "data bench: first and later epochs apart, the map's 2 MiB share" \
  || { cat bench3.log >&2; fail "data bench epochs"; }
finish
