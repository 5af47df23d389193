# Shared by the bench/ scripts (source it): medians, and the benchmark MLP's deck of bench/run.sh (issue 7).

# median_of FILE: the median of the numbers in FILE, one per line.
median_of() {
  sort -g "$1" | awk '{v[NR] = $1} END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# median_rate METRICS.h5 WARMUP: the median of /train/samples_per_sec over the steps after WARMUP, with $PYTHON (h5py).
median_rate() {
  "$PYTHON" - "$1" "$2" <<'PY'
import statistics, sys
import h5py
with h5py.File(sys.argv[1], "r") as file:
    print(f"{statistics.median(file['train/samples_per_sec'][int(sys.argv[2]):]):.2f}")
PY
}

# write_mlp_deck DECK DATA STEPS BATCH: the benchmark MLP 1024-2048-2048-10, AdamW, on the blobs set DATA
# (hpctrain data generate blobs --samples 16384 --features 1024 --classes 10 --noise 100 --seed 1).
write_mlp_deck() {
  cat >"$1" <<TOML
# The benchmark MLP of issue 7: 1024-2048-2048-10, AdamW.
[run]
seed = 1

[data]
train = "$2"
batch_size = $4

[model]
loss = "cross_entropy"
layers = [
  { type = "linear", out = 2048 },
  { type = "relu" },
  { type = "linear", out = 2048 },
  { type = "relu" },
  { type = "linear", out = 10 },
]

[optimizer]
type = "adamw"
lr = 0.001
weight_decay = 0.01

[train]
steps = $3
log_every = 10

[checkpoint]
at_end = false
TOML
}
