#!/usr/bin/env bash
# bench/augmentation.sh: what augmentation costs the loader (issue 18 item 10). Not a test: it prints measurements.
#
#   bench/augmentation.sh --build-dir build             use build/bin/hpctrain
#   bench/augmentation.sh --build-dir build --quick     small files, one round: checks the harness, measures nothing
#
# Samples per second the loader delivers ('hpctrain data bench' on R ranks, data.prefetch = 0 so the reading and the
# augmentation are timed, not hidden behind a step; median over the ranks) with and without data.augment_flip +
# data.augment_crop_padding + data.augment_rot90, for images (N, 3, 32, 32) and volumes (N, 2, 32, 32, 32) generated
# by 'hpctrain data generate', read from the file (page cache warm) and from memory (data.in_memory = true). Every
# figure is the median over --runs rounds; within a round the configurations run one after the other, with and without
# augmentation alternating, so load from elsewhere hits them alike.
# Then what reaches training: samples/s of 'hpctrain train' (1 rank x 1 thread, data.prefetch = 2: the reader thread
# augments while the step computes) for inputs/cnn2d.toml and inputs/cosmoflow-small.toml on their generated data,
# median over the steps after a warm-up, with and without augmentation, alternating in the same rounds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR="$ROOT/build"
RANKS=1
IMAGES=10000
VOLUMES=400
RUNS=5
PADDING=4
TRAIN_STEPS=60
KEEP=0

usage() {
  sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<EOF

options:
  --build-dir DIR  the build whose bin/hpctrain to run (default: build)
  --ranks R        ranks of 'data bench' (default $RANKS)
  --images N       images of 3 x 32 x 32 in the file (default $IMAGES: $((IMAGES * 3 * 32 * 32 * 4 / 1000000)) MB)
  --volumes N      volumes of 2 x 32^3 in the file (default $VOLUMES: $((VOLUMES * 2 * 32 * 32 * 32 * 4 / 1000000)) MB)
  --padding P      data.augment_crop_padding (default $PADDING)
  --runs K         rounds (default $RUNS)
  --quick          1000 images, 64 volumes, 1 round
  --keep           keep the temporary directory
EOF
}

while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --images) IMAGES=$2; shift 2 ;;
    --volumes) VOLUMES=$2; shift 2 ;;
    --padding) PADDING=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --quick) IMAGES=1000; VOLUMES=64; RUNS=1; TRAIN_STEPS=15; shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

HPCTRAIN="$BUILD_DIR/bin/hpctrain"
[[ -x $HPCTRAIN ]] || { echo "no hpctrain at $HPCTRAIN: build first, or pass --build-dir" >&2; exit 2; }
MPIEXEC=(mpiexec --oversubscribe)
[[ $(id -u) -eq 0 ]] && MPIEXEC+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-augmentation-bench.XXXXXX")
if ((KEEP)); then echo "keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
cd "$WORK"

median() {
  sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
                                   else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# --- data and decks: one epoch per 'data bench' run ---
"$HPCTRAIN" data generate images --samples "$IMAGES" --size 32 --channels 3 --seed 1 --output images.h5 >/dev/null
"$HPCTRAIN" data generate volumes --samples "$VOLUMES" --size 32 --channels 2 --seed 1 --output volumes.h5 >/dev/null
cat images.h5 volumes.h5 >/dev/null  # page cache warm
deck() {  # deck NAME FILE LOSS BATCH
  cat >"$1.toml" <<TOML
[run]
seed = 1
[data]
train = "$2"
batch_size = $4
scale = 0.5
shift = 0.1
[model]
loss = "$3"
layers = [ { type = "flatten" }, { type = "linear", out = 4 } ]
[train]
steps = 1
TOML
}
deck images images.h5 cross_entropy 256
deck volumes volumes.h5 mse 16

rate() {  # rate DECK ARGS...: 'data bench' samples/s, median over the ranks
  "${MPIEXEC[@]}" -n "$RANKS" "$HPCTRAIN" data bench "$1.toml" --set data.prefetch=0 "${@:2}" |
    awk '/median per-rank read rate/ {print $(NF - 1)}'
}
AUGMENT=(--set data.augment_flip=true --set "data.augment_crop_padding=$PADDING" --set data.augment_rot90=true)
# The example decks' samples are 16 across: padding 2.
AUGMENT_16=(--set data.augment_flip=true --set data.augment_crop_padding=2 --set data.augment_rot90=true)
declare -A rates
for ((run = 0; run < RUNS; ++run)); do
  for kind in images volumes; do
    for memory in false true; do
      rates[$kind-$memory-off]+="$(rate "$kind" --set "data.in_memory=$memory") "
      rates[$kind-$memory-on]+="$(rate "$kind" --set "data.in_memory=$memory" "${AUGMENT[@]}") "
    done
  done
done

# --- training with the example decks (their data sizes; the deck's steps cut to TRAIN_STEPS) ---
"$HPCTRAIN" data generate images --samples 2048 --size 16 --seed 1 --output cnn-train.h5 >/dev/null
"$HPCTRAIN" data generate volumes --samples 512 --size 16 --channels 2 --seed 1 --output cosmo-train.h5 >/dev/null
train_rate() {  # train_rate NAME DECK DATA ARGS...: median samples/s of the logged steps after the first 10
  "${MPIEXEC[@]}" -n 1 "$HPCTRAIN" train "$ROOT/inputs/$2.toml" --output "$1" --set "data.train=$WORK/$3" \
    --set data.validation=[] --set train.epochs=0 --set "train.steps=$TRAIN_STEPS" --set train.log_every=1 \
    --set checkpoint.at_end=false "${@:4}" >"$1.log" 2>&1 || { cat "$1.log" >&2; exit 1; }
  awk '$1 == "step" {split($2, s, "/"); if (s[1] > 10) for (i = 1; i <= NF; ++i)
    if ($(i) == "samples/s") print $(i - 1)}' "$1.log" | median
}
for ((run = 0; run < RUNS; ++run)); do
  for deck in cnn2d:cnn-train.h5 cosmoflow-small:cosmo-train.h5; do
    name=${deck%%:*} data=${deck#*:}
    rates[train-$name-off]+="$(train_rate "run-$name-off-$run" "$name" "$data") "
    rates[train-$name-on]+="$(train_rate "run-$name-on-$run" "$name" "$data" "${AUGMENT_16[@]}") "
  done
done

# --- report ---
echo "hpctrain augmentation benchmark: loader samples/s ('hpctrain data bench', data.prefetch = 0, $RANKS rank(s) x" \
  "1 thread, median over ranks), median of $RUNS rounds; augmentation = flip + crop (padding $PADDING) + rot90"
printf '  %-44s %14s %14s %9s\n' "data" "without" "with" "cost"
for kind in images volumes; do
  for memory in false true; do
    off=$(printf '%s\n' ${rates[$kind-$memory-off]} | median)
    on=$(printf '%s\n' ${rates[$kind-$memory-on]} | median)
    case $kind in
      images) what="images $IMAGES x 3 x 32 x 32" ;;
      volumes) what="volumes $VOLUMES x 2 x 32^3" ;;
    esac
    [[ $memory == true ]] && what+=", in memory" || what+=", from the file"
    printf '  %-44s %14s %14s %9s\n' "$what" "$off/s" "$on/s" \
      "$(awk -v a="$on" -v b="$off" 'BEGIN {printf "%+.0f%%", 100 * (b / a - 1)}')"
  done
done
echo "training samples/s ('hpctrain train', 1 rank x 1 thread, data.prefetch = 2, median of steps 11..$TRAIN_STEPS)," \
  "augmentation = flip + crop (padding 2) + rot90:"
for deck in cnn2d cosmoflow-small; do
  off=$(printf '%s\n' ${rates[train-$deck-off]} | median)
  on=$(printf '%s\n' ${rates[train-$deck-on]} | median)
  printf '  %-44s %14s %14s %9s\n' "inputs/$deck.toml" "$off/s" "$on/s" \
    "$(awk -v a="$on" -v b="$off" 'BEGIN {printf "%+.0f%%", 100 * (b / a - 1)}')"
done
