#!/usr/bin/env bash
# bench/cnn.sh: training images/s of the example CNNs on CPU, fp32 and bf16, against their PyTorch twins (issue 8).
#
#   bench/cnn.sh                      run with build/release (build it first: cmake --build --preset release)
#   bench/cnn.sh --build-dir DIR      use DIR/bin/hpctrain
#   bench/cnn.sh --quick              1 round of 10 steps, fp32 only: checks the harness, measures nothing
#   bench/cnn.sh --fp32-only          fp32 rows only (PyTorch's bf16 autocast runs ~50x slower without bf16 instructions)
#
# Then DIR/bin/spatial_kernels (when built) times the 3-D model's convolutions and poolings through hpctrain's backend
# against oneDNN's primitives called directly.
#
# Models: inputs/cnn2d.toml (1 x 16 x 16 images, batch 64), inputs/cosmoflow-small.toml (2 x 16^3 volumes, batch 32) and
# cosmoflow-small-gn (the same with groupnorm after each convolution), trained on generated data on 1 rank x T threads
# (T = the cores), and bench/torch_twin.py --model cnn2d|cosmoflow-small|cosmoflow-small-gn (the same layers, batch,
# AdamW and data; bf16 = autocast) with T threads. hpctrain also runs with
# HPCTRAIN_SPATIAL_LAYOUT=channels_first (the conv stack in the file layout, oneDNN reordering per call) to show what
# the channels-last layout gains. A hpctrain run's figure is the median of /train/samples_per_sec over the steps after
# the warm-up; a twin run's the median over its timed windows; the table shows the median over the rounds, which
# alternate between all configurations so that load from elsewhere hits all.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/lib/bench.bash"
# bench/install-torch.sh's environment (PyTorch from PyPI, Debian's h5py) when it exists, else Debian's python3 (h5py;
# a pyenv python3 may come first on PATH).
PYTHON=${HPCTRAIN_TORCH_VENV:-$ROOT/bench/.venv}/bin/python
[[ -x $PYTHON ]] || PYTHON=/usr/bin/python3
BUILD_DIR=$ROOT/build/release
RUNS=3
STEPS=60
WARMUP_STEPS=10
THREADS=$(nproc)
QUICK=
TWIN_COMPILE=auto  # --quick: off (torch.compile takes minutes; a smoke test measures nothing)
PRECISIONS=(fp32 bf16)
while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --fp32-only) PRECISIONS=(fp32); shift ;;  # e.g. on CPUs without bf16 instructions, where PyTorch's autocast crawls
    --quick) RUNS=1; STEPS=10; WARMUP_STEPS=2; PRECISIONS=(fp32); QUICK=--quick; TWIN_COMPILE=off; shift ;;
    -h | --help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/cnn.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
HPCTRAIN=$BUILD_DIR/bin/hpctrain
[[ -x $HPCTRAIN ]] || { echo "bench/cnn.sh: no $HPCTRAIN; build first or pass --build-dir" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-bench-cnn.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=$THREADS

"$HPCTRAIN" data generate images --samples 8000 --seed 1 --output "$WORK/images.h5" >/dev/null
"$HPCTRAIN" data generate volumes --samples 1024 --size 16 --channels 2 --seed 1 --output "$WORK/volumes.h5" >/dev/null
MODELS=(cnn2d cosmoflow-small cosmoflow-small-gn)
declare -A DATA=([cnn2d]=$WORK/images.h5 [cosmoflow-small]=$WORK/volumes.h5 [cosmoflow-small-gn]=$WORK/volumes.h5)
declare -A BATCH=([cnn2d]=64 [cosmoflow-small]=32 [cosmoflow-small-gn]=32)
# cosmoflow-small-gn: inputs/cosmoflow-small.toml with a groupnorm (4 groups) after each convolution.
block() { echo "{type=\"conv3d\", out=$1, kernel=3, padding=1}, {type=\"groupnorm\", groups=4},
  {type=\"leaky_relu\", negative_slope=0.3}, {type=\"maxpool3d\", kernel=2}"; }
GN_LAYERS="[$(block 8), $(block 16), $(block 16), {type=\"flatten\"}, {type=\"linear\", out=64},
  {type=\"leaky_relu\", negative_slope=0.3}, {type=\"linear\", out=3}]"
declare -A DECK=([cnn2d]=cnn2d [cosmoflow-small]=cosmoflow-small [cosmoflow-small-gn]=cosmoflow-small)
declare -A LAYERS=([cosmoflow-small-gn]=$GN_LAYERS)
LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
HAVE_TORCH=1
"$PYTHON" -c 'import torch' 2>/dev/null || HAVE_TORCH=0


for ((round = 1; round <= RUNS; ++round)); do
  for model in "${MODELS[@]}"; do
    layers=()
    [[ -n ${LAYERS[$model]:-} ]] && layers=(--set "model.layers=${LAYERS[$model]}")
    for precision in "${PRECISIONS[@]}"; do
      for layout in channels_last channels_first; do
        run=$WORK/$model-$precision-$layout-$round
        HPCTRAIN_SPATIAL_LAYOUT=$layout "$HPCTRAIN" train "$ROOT/inputs/${DECK[$model]}.toml" --output "$run" \
          "${layers[@]}" --set "data.train=${DATA[$model]}" --set 'data.validation=""' --set train.epochs=0 \
          --set "train.steps=$STEPS" --set "train.log_every=$STEPS" --set "precision.mode=$precision" \
          --set checkpoint.at_end=false >"$run.log" 2>&1 || { cat "$run.log" >&2; exit 1; }
        "$PYTHON" - "$run/metrics.h5" "$WARMUP_STEPS" >>"$WORK/$model-$precision.$layout" <<'PY'
import h5py, statistics, sys
print(statistics.median(h5py.File(sys.argv[1], "r")["train/samples_per_sec"][int(sys.argv[2]):]))
PY
      done
      run=$WORK/$model-$precision-$round
      if ((HAVE_TORCH)); then
        "$PYTHON" "$ROOT/bench/torch_twin.py" --model "$model" --precision "$precision" --data "${DATA[$model]}" \
          --batch "${BATCH[$model]}" --threads "$THREADS" --warmup "$WARMUP_STEPS" --windows 5 --compile "$TWIN_COMPILE" \
          --window-steps $(((STEPS - WARMUP_STEPS) / 5)) >"$run.twin" 2>&1 || { cat "$run.twin" >&2; exit 1; }
        sed -n 's/^TWIN .*samples_per_sec=\([0-9.]*\).*/\1/p' "$run.twin" >>"$WORK/$model-$precision.torch"
      fi
    done
  done
done

echo "bench/cnn.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), 1 rank x $THREADS threads,"
echo "  load average $LOAD_AT_START at start, $(cut -d' ' -f1-3 /proc/loadavg) at end (other work on the machine skews the figures)"
echo "  $RUNS round(s) of $STEPS steps (median after $WARMUP_STEPS warm-up steps); torch: $(
  ((HAVE_TORCH)) && "$PYTHON" -c 'import torch; print(torch.__version__)' || echo 'not installed (bench/install-torch.sh)')"
printf '%-19s %-6s %6s %16s %16s %8s %18s %8s\n' model mode batch "hpctrain img/s" "torch img/s" ratio \
  "channels-first" gain
for model in "${MODELS[@]}"; do
  for precision in "${PRECISIONS[@]}"; do
    mine=$(median_of "$WORK/$model-$precision.channels_last")
    before=$(median_of "$WORK/$model-$precision.channels_first")
    gain=$(awk -v a="$mine" -v b="$before" 'BEGIN {printf "%.2f", a / b}')
    if [[ -s $WORK/$model-$precision.torch ]]; then
      theirs=$(median_of "$WORK/$model-$precision.torch")
      ratio=$(awk -v a="$mine" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}')
    else
      theirs="not measured" ratio="-"
    fi
    printf '%-19s %-6s %6s %16.0f %16s %8s %18.0f %8s\n' "$model" "$precision" "${BATCH[$model]}" "$mine" "$theirs" \
      "$ratio" "$before" "$gain"
  done
done
if [[ -x $BUILD_DIR/bin/spatial_kernels ]]; then
  echo
  "$BUILD_DIR/bin/spatial_kernels" $QUICK
else
  echo "not run: spatial_kernels (not built: HPCTRAIN_BENCHMARKS=OFF)"
fi
