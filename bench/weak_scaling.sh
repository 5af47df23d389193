#!/usr/bin/env bash
# bench/weak_scaling.sh: the weak-scaling row of bench/run.sh (the benchmark MLP at 128 samples per rank, 1 thread per
# rank, bound to cores) for each gradient all-reduce algorithm, side by side in alternating rounds.
#
#   bench/weak_scaling.sh [--build-dir DIR] [--rounds N] [--steps N]
#                         [--algorithms "rank-order rank-order-replicated library"]
#
# Each round runs 1 rank at batch 128, then 2 ranks at batch 256 once per algorithm: HPCTRAIN_MPI_ALLREDUCE=ALGORITHM,
# and for a name ending in -replicated HPCTRAIN_MPI_OPTIMIZER=replicated (every rank updates every parameter; rank-order
# alone shards the update, library replicates it). A run's figure is the median of /train/samples_per_sec after 10
# warm-up steps, its all-reduce wait, backward and optimizer rank 0's --profile ms/step; a row's figure is the median
# over the rounds. Weak scaling: the median over the rounds of the round's 2-rank rate / (2 x its 1-rank rate).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/lib/bench.bash"
BUILD_DIR=$ROOT/build/release
ROUNDS=5
STEPS=100
ALGORITHMS="rank-order rank-order-replicated library"
while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --algorithms) ALGORITHMS=$2; shift 2 ;;
    -h | --help) sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "weak_scaling.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
((STEPS > 20)) || { echo "weak_scaling.sh: --steps must exceed 20" >&2; exit 2; }
HPCTRAIN=$BUILD_DIR/bin/hpctrain
[[ -x $HPCTRAIN ]] || { echo "weak_scaling.sh: no $HPCTRAIN (build first: cmake --build --preset release)" >&2; exit 1; }
PYTHON=${HPCTRAIN_TORCH_VENV:-$ROOT/bench/.venv}/bin/python
[[ -x $PYTHON ]] || PYTHON=/usr/bin/python3
MPIEXEC=(mpiexec)
((EUID == 0)) && MPIEXEC+=(--allow-run-as-root)
# (nproc alone would count OMP_NUM_THREADS, not the cores this process may run on)
(($(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) >= 2)) || { echo "weak_scaling.sh: needs 2 cores" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-weak.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$HPCTRAIN" data generate blobs --samples 16384 --features 1024 --classes 10 --noise 100 --seed 1 \
  --output "$WORK/blobs.h5" >/dev/null
write_mlp_deck "$WORK/mlp.toml" "$WORK/blobs.h5" "$STEPS" 128

# profile_ms LOG PHASE: the phase's ms/step (warm-up included) from the --profile table at the end of a run's log.
profile_ms() {
  awk -v phase="$2" '/^profile/ { inside = 1; next }
    inside && index($0, phase) { split(substr($0, index($0, phase) + length(phase)), f, " "); print f[2]; exit }' "$1"
}

# run NAME RANKS [ALGORITHM]: appends samples/s to NAME.rates, the all-reduce wait, backward and optimizer (ms/step,
# rank 0) to NAME.wait, NAME.backward and NAME.optimizer.
run() {
  local name=$1 ranks=$2 algorithm=${3:-rank-order} output layout=
  output=$WORK/run-$name
  rm -rf "$output"
  [[ $algorithm == *-replicated ]] && layout=replicated
  OMP_NUM_THREADS=1 HPCTRAIN_MPI_ALLREDUCE=${algorithm%-replicated} HPCTRAIN_MPI_OPTIMIZER=$layout \
    timeout 600 "${MPIEXEC[@]}" -n "$ranks" --bind-to core -x OMP_NUM_THREADS -x HPCTRAIN_MPI_ALLREDUCE \
    -x HPCTRAIN_MPI_OPTIMIZER "$HPCTRAIN" train "$WORK/mlp.toml" \
    --set data.batch_size=$((128 * ranks)) --output "$output" --profile >"$output.log" 2>&1 ||
    { echo "weak_scaling.sh: $name failed:" >&2; tail -20 "$output.log" >&2; exit 1; }
  median_rate "$output/metrics.h5" 10 >>"$WORK/$name.rates"
  profile_ms "$output.log" "all-reduce wait" >>"$WORK/$name.wait"
  profile_ms "$output.log" "backward" >>"$WORK/$name.backward"
  profile_ms "$output.log" "optimizer" >>"$WORK/$name.optimizer"
}

for ((round = 1; round <= ROUNDS; ++round)); do
  echo "round $round of $ROUNDS ($(date -u +%H:%M:%S) UTC)" >&2
  run one 1
  for algorithm in $ALGORITHMS; do run "two-$algorithm" 2 "$algorithm"; done
done

one=$(median_of "$WORK/one.rates")
echo "weak scaling, $(lscpu | sed -n 's/^Model name: *//p'), $ROUNDS rounds x $STEPS steps, median samples/s:"
printf '%-34s %10s %13s %15s %12s %12s   %s\n' "run" "samples/s" "weak scaling" "all-reduce wait" "backward" \
  "optimizer" "each round's samples/s"
printf '%-34s %10.0f %13s %15s %9.2f ms %9.2f ms   %s\n' "1 rank, batch 128" "$one" "" "" \
  "$(median_of "$WORK/one.backward")" "$(median_of "$WORK/one.optimizer")" "$(awk '{ printf "%.0f ", $1 }' "$WORK/one.rates")"
for algorithm in $ALGORITHMS; do
  rate=$(median_of "$WORK/two-$algorithm.rates")
  # each round's 2-rank rate against twice that round's 1-rank rate (drift between rounds cancels), median
  paste "$WORK/two-$algorithm.rates" "$WORK/one.rates" | awk '{ print $1 / (2 * $2) }' >"$WORK/two-$algorithm.ratios"
  printf '%-34s %10.0f %13.3f %12.2f ms %9.2f ms %9.2f ms   %s\n' "2 ranks, $algorithm" "$rate" \
    "$(median_of "$WORK/two-$algorithm.ratios")" "$(median_of "$WORK/two-$algorithm.wait")" \
    "$(median_of "$WORK/two-$algorithm.backward")" "$(median_of "$WORK/two-$algorithm.optimizer")" \
    "$(awk '{ printf "%.0f ", $1 }' "$WORK/two-$algorithm.rates")"
done
