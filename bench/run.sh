#!/usr/bin/env bash
# bench/run.sh: hpctrain's CPU benchmarks side by side with their anchors, in one run, as one table (issue 7).
#
#   bench/run.sh                      build (cmake --preset release), then run every benchmark (a few minutes)
#   bench/run.sh --build-dir build-f  use an existing build (its bin/hpctrain and bin/gemm_ceiling), no build step
#   bench/run.sh --quick              fewer steps and runs: a smoke test of the harness, not a measurement
#
# What runs (the MLP 1024-2048-2048-10, AdamW, cross-entropy, on a 16384-sample blobs set):
#   - hpctrain fp32 and bf16 at global batch 256 on 1 rank x T threads (T = the cores), and bench/torch_twin.py (the
#     same model, batch, optimizer and data in PyTorch, T threads), in alternating rounds so that load from elsewhere
#     hits both. A hpctrain run's figure is the median of /train/samples_per_sec (metrics.h5) over the steps after the
#     warm-up; a twin run's is the median over its timed windows; a row's figure is the median over the rounds. The
#     twin is skipped, and the table says so, when no torch is importable (bench/install-torch.sh installs PyTorch
#     from PyPI into bench/.venv, which this script then uses).
#   - peak memory (max RSS from /usr/bin/time -v) of those hpctrain runs, against what the model needs.
#   - gemm_ceiling: oneDNN matmuls of the step's shapes with T threads (the practical FLOP ceiling).
#   - optimizer_pass: the optimizer phase's kernels (gradient norm + AdamW, fp32 and with the bf16 copy) on the
#     model's parameter count against a pass with the same memory traffic, T threads.
#   - weak scaling: 128 samples per rank on 1 rank and on 2 ranks, 1 thread per rank, and the all-reduce share of the
#     2-rank run from --profile.
#   - where the time goes: the --profile phases in the steady state (a full run minus a short run).
# The data set is blobs with noise 100: hard enough that the loss stays well above zero for the whole run. (On an
# easily separable set the loss reaches 0 within a few dozen steps and the gradients become subnormal floats, which
# the CPU handles ~10x slower; docs/performance.md has the measurement. That is a robustness problem, not the
# steady-state speed this table is about.)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/lib/bench.bash"
# bench/install-torch.sh's environment (PyTorch from PyPI, Debian's h5py) when it exists, else Debian's python3 (h5py;
# a pyenv python3 may come first on PATH).
PYTHON=${HPCTRAIN_TORCH_VENV:-$ROOT/bench/.venv}/bin/python
[[ -x $PYTHON ]] || PYTHON=/usr/bin/python3
BUILD_DIR=""
BUILT_HERE=0
PRESET=release
RUNS=3           # rounds: runs of each hpctrain configuration and of the twin
STEPS=100        # optimizer steps per hpctrain run
WARMUP_STEPS=10  # leading steps left out of each run's median (primitive creation, page faults, cache warm-up)
TWIN_WINDOWS=5
TWIN_WARMUP=10
TWIN_WINDOW_STEPS=20
CEILING_REPEATS=30
OPTIMIZER_ROUNDS=20
TWIN_COMPILE=auto  # torch.compile in the twin; --quick turns it off (compiling takes minutes, a smoke test measures nothing)
# (--quick also runs the twin for 3 steps only: its bf16 autocast runs ~10 samples/s on a CPU without AVX512-BF16)
KEEP=0

usage() {
  sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<EOF

options:
  --build-dir DIR  use the hpctrain and gemm_ceiling of an existing build in DIR (skips the build)
  --preset NAME    CMake configure/build preset to build with (default: release; cpu-only skips CUDA)
  --runs N         rounds: runs of each hpctrain configuration and of the twin (default $RUNS)
  --steps N        steps per hpctrain run (default $STEPS; the first $WARMUP_STEPS are warm-up)
  --quick          1 run of 30 steps each, short twin and ceiling: checks the harness, measures nothing
  --keep           keep the temporary directory with data, decks, runs and logs
EOF
}

while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --preset) PRESET=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --quick) RUNS=1; STEPS=30; TWIN_WINDOWS=2; TWIN_WINDOW_STEPS=1; TWIN_WARMUP=1; CEILING_REPEATS=5; OPTIMIZER_ROUNDS=3; TWIN_COMPILE=off; shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
((STEPS > 2 * WARMUP_STEPS)) || { echo "run.sh: --steps must exceed twice the $WARMUP_STEPS warm-up steps" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-bench.XXXXXX")
if ((KEEP)); then echo "run.sh: keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
RESULTS=$WORK/results.txt  # key=value lines, read by the table at the end
COMMANDS=$WORK/commands.txt
: >"$RESULTS"
: >"$COMMANDS"
record() { echo "$1=$2" >>"$RESULTS"; }
log() { echo "run.sh: $*" >&2; }

# ---- build ----
if [[ -z $BUILD_DIR ]]; then
  log "building with the '$PRESET' preset"
  (cd "$ROOT" && cmake --preset "$PRESET" >"$WORK/configure.log" 2>&1) || { cat "$WORK/configure.log" >&2; exit 1; }
  # Only the two programs the benchmark runs: the test suite is not needed here.
  (cd "$ROOT" && cmake --build --preset "$PRESET" -j2 --target hpctrain gemm_ceiling optimizer_pass allreduce_alone >"$WORK/build.log" 2>&1) ||
    { tail -40 "$WORK/build.log" >&2; exit 1; }
  BUILD_DIR=$ROOT/build/$PRESET  # every preset's binaryDir is build/<preset name> (CMakePresets.json)
  BUILT_HERE=1
fi
HPCTRAIN=$BUILD_DIR/bin/hpctrain
CEILING=$BUILD_DIR/bin/gemm_ceiling
OPTIMIZER_PASS=$BUILD_DIR/bin/optimizer_pass
ALLREDUCE_ALONE=$BUILD_DIR/bin/allreduce_alone
for program in "$HPCTRAIN" "$CEILING" "$OPTIMIZER_PASS" "$ALLREDUCE_ALONE"; do
  [[ -x $program ]] || { echo "run.sh: $program is missing; build it or pass --build-dir" >&2; exit 1; }
done

# ---- machine and configuration ----
CORES=$(nproc)
THREADS=$CORES  # one rank using every core: the configuration a single-process PyTorch run compares with
MPIEXEC=(mpiexec --oversubscribe)
[[ $(id -u) -eq 0 ]] && MPIEXEC+=(--allow-run-as-root)
CPU_MODEL=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
TORCH_VERSION=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not installed")
record date "$(date -u '+%Y-%m-%d %H:%M UTC')"
record cpu "$CPU_MODEL"
record cores "$CORES"
record threads "$THREADS"
record load_start "$(cut -d' ' -f1-3 /proc/loadavg)"
record torch "$TORCH_VERSION"
if [[ $BUILT_HERE -eq 1 ]] && git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  record build "commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- || echo ' + uncommitted changes')"
else
  record build "$BUILD_DIR"  # a prebuilt tree: which sources it holds is for the caller to say
fi
record runs "$RUNS"
record steps "$STEPS"
record warmup "$WARMUP_STEPS"

# ---- data and deck ----
DATA=$WORK/blobs-1024.h5
"$HPCTRAIN" data generate blobs --samples 16384 --features 1024 --classes 10 --noise 100 --seed 1 --output "$DATA" \
  >/dev/null
echo "hpctrain data generate blobs --samples 16384 --features 1024 --classes 10 --noise 100 --seed 1 --output DATA" \
  >>"$COMMANDS"
DECK=$WORK/mlp.toml
write_mlp_deck "$DECK" "$DATA" "$STEPS" 256

# profile_field LOG PHASE: the phase's total seconds from the --profile table at the end of a run's log.
profile_field() {
  awk -v phase="$2" '
    /^profile/ { inside = 1; next }
    inside && index($0, phase) { rest = substr($0, index($0, phase) + length(phase)); split(rest, f, " ");
                                 print f[1]; exit }' "$1"
}

PHASES=("data wait" "forward + loss" "backward" "all-reduce wait" "optimizer")
SHORT_STEPS=$((2 * WARMUP_STEPS))
RUN_COUNT=0  # numbers the run directories

# hpctrain_run NAME RANKS THREADS BIND SET...: one round of a configuration: a run of STEPS steps and one of
# SHORT_STEPS steps. Appends the long run's median samples/s to NAME.rates, its peak RSS (1-rank runs) to NAME.rss,
# and each phase's steady-state ms/step to NAME.<phase>: --profile totals include the warm-up steps, so the
# difference of the two runs' totals over the difference of their step counts is what a step costs once warm.
hpctrain_run() {
  local name=$1 ranks=$2 threads=$3 bind=$4; shift 4
  local overrides=() setting steps
  for setting in "$@"; do overrides+=(--set "$setting"); done
  mkdir -p "$WORK/runs"
  for steps in "$STEPS" "$SHORT_STEPS"; do
    RUN_COUNT=$((RUN_COUNT + 1))
    local output=$WORK/runs/$RUN_COUNT-$name-$steps timer=()
    ((ranks == 1)) && timer=(/usr/bin/time -v -o "$output.time")
    OMP_NUM_THREADS=$threads timeout 600 "${MPIEXEC[@]}" -n "$ranks" --bind-to "$bind" -x OMP_NUM_THREADS="$threads" \
      "${timer[@]}" "$HPCTRAIN" train "$DECK" "${overrides[@]}" --set train.steps="$steps" --output "$output" \
      --profile >"$output.log" 2>&1 || { log "$name ($steps steps) failed:"; tail -20 "$output.log" >&2; exit 1; }
    if ((steps == STEPS)); then
      local long_log=$output.log
      median_rate "$output/metrics.h5" "$WARMUP_STEPS" >>"$WORK/$name.rates"
      if ((ranks == 1)); then sed -n 's/.*Maximum resident set size (kbytes): //p' "$output.time" >>"$WORK/$name.rss"; fi
    else
      local phase long short
      for phase in "${PHASES[@]}"; do
        long=$(profile_field "$long_log" "$phase")
        short=$(profile_field "$output.log" "$phase")
        awk -v l="$long" -v s="$short" -v n=$((STEPS - SHORT_STEPS)) 'BEGIN { v = (l - s) / n * 1e3;
          printf "%.3f\n", (v > 0 ? v : 0) }' >>"$WORK/$name.${phase%% *}"
      done
    fi
  done
  [[ -f $WORK/$name.command ]] ||
    echo "OMP_NUM_THREADS=$threads mpiexec -n $ranks --bind-to $bind hpctrain train DECK ${overrides[*]}" \
      "--set train.steps={$STEPS,$SHORT_STEPS} --profile" >"$WORK/$name.command"
}

# Without bf16 instructions (AVX512-BF16 or AMX) PyTorch's bf16 autocast falls back to loops that run ~10-100
# samples/s (hours for a full twin run); there the bf16 twin runs once, eager, for 2 timed steps, and the table says so.
CPU_HAS_BF16=0
grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && CPU_HAS_BF16=1

# twin_run PRECISION ROUND: one run of the PyTorch twin; appends its median over windows to twin_PRECISION.rates.
twin_run() {
  local log_file=$WORK/twin-$1.log
  local warmup=$TWIN_WARMUP compile=$TWIN_COMPILE windows=$TWIN_WINDOWS window_steps=$TWIN_WINDOW_STEPS
  if [[ $1 == bf16 && $CPU_HAS_BF16 -eq 0 ]]; then
    (($2 == 1)) || return 0
    warmup=1 compile=off windows=1 window_steps=2
    record twin_bf16_short "1 run, eager, 2 timed steps after 1 warm-up (no bf16 instructions on this CPU)"
  fi
  "$PYTHON" "$ROOT/bench/torch_twin.py" --precision "$1" --threads "$THREADS" --data "$DATA" --warmup "$warmup" \
    --compile "$compile" --windows "$windows" --window-steps "$window_steps" >"$log_file" 2>&1 ||
    { tail -20 "$log_file" >&2; exit 1; }
  local line
  line=$(grep '^TWIN ' "$log_file" | tail -1)
  sed -n 's/.*samples_per_sec=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/twin_$1.rates"
  record "twin_$1_compile" "$(sed -n 's/.*compile=\([a-z]*\).*/\1/p' <<<"$line")"
  cp "$log_file" "$WORK/twin-$1.last.log"
}

# phase_limits LOG NAME PRECISION: the limits of the roofline table from a gemm_ceiling log: the forward and backward
# products' summed medians and the same-traffic memory pass (ms), appended to limit_NAME_{forward,backward,optimizer}
# .rates; the pass's rate (GB/s) to limit_NAME_gbps.rates, for the element-wise work's limit.
phase_limits() {
  local log_file=$1 name=$2 precision=$3 line
  line=$(grep "^PHASES precision=$precision " "$log_file" || true)
  sed -n 's/.*forward_seconds=\([0-9.e+-]*\).*/\1/p' <<<"$line" | awk '{ printf "%.4f\n", $1 * 1e3 }' \
    >>"$WORK/limit_${name}_forward.rates"
  sed -n 's/.*backward_seconds=\([0-9.e+-]*\).*/\1/p' <<<"$line" | awk '{ printf "%.4f\n", $1 * 1e3 }' \
    >>"$WORK/limit_${name}_backward.rates"
  line=$(grep "^MEMORY precision=$precision " "$log_file" || true)
  sed -n 's/.*gbps=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/limit_${name}_gbps.rates"
  # The optimizer's limit: the pass with the caches flushed first (MEMORY_COLD; see gemm_ceiling.cpp: the hot pass
  # measures the last-level cache where it holds the whole state), else the hot one (an older gemm_ceiling).
  line=$(grep "^MEMORY_COLD precision=$precision " "$log_file" || grep "^MEMORY precision=$precision " "$log_file" ||
    true)
  sed -n 's/.* seconds=\([0-9.e+-]*\).*/\1/p' <<<"$line" | awk '{ printf "%.4f\n", $1 * 1e3 }' \
    >>"$WORK/limit_${name}_optimizer.rates"
}

# ceiling_run: one run of gemm_ceiling; appends each precision's step rate to ceiling_PRECISION.rates, and the
# roofline limits of the 1 x THREADS runs (and, with a second core, of the weak-scaling ranks: batch 128, 1 thread).
ceiling_run() {
  OMP_NUM_THREADS=$THREADS "$CEILING" --batch 256 --threads "$THREADS" --repeats "$CEILING_REPEATS" \
    >"$WORK/ceiling.log" 2>&1 || { cat "$WORK/ceiling.log" >&2; exit 1; }
  local precision line
  for precision in fp32 bf16; do
    line=$(grep "^CEILING precision=$precision " "$WORK/ceiling.log" || true)
    sed -n 's/.*gflops=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/ceiling_$precision.rates"
    record "ceiling_flops_per_step" "$(sed -n 's/.*flops_per_step=\([0-9]*\).*/\1/p' <<<"$line")"
    # The optimizer phase's memory traffic at trivial arithmetic: the anchor of the optimizer row.
    line=$(grep "^MEMORY precision=$precision " "$WORK/ceiling.log" || true)
    sed -n 's/.*gbps=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/memory_$precision.rates"
    record "memory_${precision}_bytes" "$(sed -n 's/.* bytes=\([0-9]*\).*/\1/p' <<<"$line")"
    line=$(grep "^MEMORY_COLD precision=$precision " "$WORK/ceiling.log" || true)
    sed -n 's/.*gbps=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/memory_cold_$precision.rates"
    phase_limits "$WORK/ceiling.log" "$precision" "$precision"
  done
  record onednn "$(sed -n 's/^gemm_ceiling: oneDNN \([0-9.]*\) .*/\1/p' "$WORK/ceiling.log")"
  if ((CORES >= 2)); then
    OMP_NUM_THREADS=1 "$CEILING" --batch 128 --threads 1 --precision fp32 --repeats "$CEILING_REPEATS" \
      >"$WORK/ceiling-weak.log" 2>&1 || { cat "$WORK/ceiling-weak.log" >&2; exit 1; }
    phase_limits "$WORK/ceiling-weak.log" weak2 fp32
  fi
}

# allreduce_run: the gradients' all-reduce alone on 2 ranks x 1 core, in hpctrain's buckets (the communication limit
# of the weak-scaling run); appends ms to limit_weak2_allreduce.rates.
allreduce_run() {
  "${MPIEXEC[@]}" -n 2 --bind-to core "$ALLREDUCE_ALONE" --widths 1024,2048,2048,10 --repeats "$CEILING_REPEATS" \
    >"$WORK/allreduce.log" 2>&1 || { cat "$WORK/allreduce.log" >&2; exit 1; }
  sed -n "s/^ALLREDUCE algorithm=${HPCTRAIN_MPI_ALLREDUCE:-rank-order} .*seconds=\([0-9.e+-]*\).*/\1/p" "$WORK/allreduce.log" | awk '{ printf "%.4f\n", $1 * 1e3 }' \
    >>"$WORK/limit_weak2_allreduce.rates"
}

# optimizer_run: one run of optimizer_pass; appends each precision's ratio (pass time / hpctrain's) and hpctrain's
# GB/s to optimizer_PRECISION.rates and optimizer_gbps_PRECISION.rates.
optimizer_run() {
  OMP_NUM_THREADS=$THREADS "$OPTIMIZER_PASS" --rounds "$OPTIMIZER_ROUNDS" >"$WORK/optimizer.log" 2>&1 ||
    { cat "$WORK/optimizer.log" >&2; exit 1; }
  local precision line
  for precision in fp32 bf16; do
    line=$(grep "^OPTIMIZER precision=$precision " "$WORK/optimizer.log" || true)
    sed -n 's/.*ratio=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/optimizer_$precision.rates"
    awk '{ for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] } }
         END { printf "%.2f\n", v["bytes"] / v["hpctrain_seconds"] * 1e-9 }' <<<"$line" \
      >>"$WORK/optimizer_gbps_$precision.rates"
  done
}

# summarize NAME: NAME_rate = the median over the rounds, NAME_runs = every round's figure, NAME_rss_kib = the largest
# RSS, NAME_<phase>_ms = the median steady-state ms/step of each phase.
summarize() {
  [[ -s $WORK/$1.rates ]] || return 0
  record "$1_rate" "$(median_of "$WORK/$1.rates")"
  record "$1_runs" "$(tr '\n' ' ' <"$WORK/$1.rates")"
  log "$1: per round: $(tr '\n' ' ' <"$WORK/$1.rates")"
  if [[ -s $WORK/$1.rss ]]; then record "$1_rss_kib" "$(sort -g "$WORK/$1.rss" | tail -1)"; fi
  local phase
  for phase in "${PHASES[@]}"; do
    if [[ -s $WORK/$1.${phase%% *} ]]; then record "$1_${phase%% *}_ms" "$(median_of "$WORK/$1.${phase%% *}")"; fi
  done
  if [[ -f $WORK/$1.command ]]; then echo "$(cat "$WORK/$1.command") (x$(wc -l <"$WORK/$1.rates"))" >>"$COMMANDS"; fi
}

HAVE_TORCH=1
if [[ $TORCH_VERSION == "not installed" ]]; then
  HAVE_TORCH=0
  log "torch: not installed for $PYTHON (bench/install-torch.sh installs it); the torch rows are not measured"
fi

# ---- rounds ----
# Each round runs every configuration once: hpctrain and the twin in fp32 and bf16 on 1 rank x THREADS, the weak
# scaling pair, the matmul ceiling. Interleaving them means that a burst of load from elsewhere on a shared machine
# hits all of them a little rather than one of them entirely; each row's figure is the median over the rounds.
# --bind-to none: Open MPI binds a lone rank to one core by default, which would leave its threads one core.
for ((round = 1; round <= RUNS; round++)); do
  log "round $round of $RUNS (load average $(cut -d' ' -f1 /proc/loadavg))"
  cut -d' ' -f1 /proc/loadavg >>"$WORK/load.rates"
  for precision in fp32 bf16; do
    hpctrain_run "$precision" 1 "$THREADS" none precision.mode="$precision"
    if ((HAVE_TORCH)); then twin_run "$precision" "$round"; fi
  done
  hpctrain_run weak1 1 1 core data.batch_size=128
  if ((CORES >= 2)); then hpctrain_run weak2 2 1 core data.batch_size=256; fi
  ceiling_run
  if ((CORES >= 2)); then allreduce_run; fi
  optimizer_run
done
# The runtime's own footprint (MPI, HDF5, oneDNN, the data batch, metrics): the same run with a tiny model.
hpctrain_run baseline 1 "$THREADS" none precision.mode=fp32 \
  'model.layers=[{type="linear", out=16}, {type="relu"}, {type="linear", out=10}]'
((CORES >= 2)) || log "weak scaling: 1 core only; the 2-rank row is not measured"
for name in fp32 bf16 baseline weak1 weak2 twin_fp32 twin_bf16 ceiling_fp32 ceiling_bf16 memory_fp32 memory_bf16 \
  memory_cold_fp32 memory_cold_bf16 \
  optimizer_fp32 optimizer_bf16 optimizer_gbps_fp32 optimizer_gbps_bf16; do
  summarize "$name"
done
for name in fp32 bf16 weak2; do
  for phase in forward backward optimizer gbps allreduce; do
    if [[ -s $WORK/limit_${name}_$phase.rates ]]; then
      record "limit_${name}_$phase" "$(median_of "$WORK/limit_${name}_$phase.rates")"
    fi
  done
done
if ((HAVE_TORCH)); then
  grep -h '^torch_twin:' "$WORK"/twin-*.last.log | sed 's/^/  /' >&2
  echo "python3 bench/torch_twin.py --precision {fp32,bf16} --threads $THREADS --data DATA --warmup $TWIN_WARMUP" \
    "--windows $TWIN_WINDOWS --window-steps $TWIN_WINDOW_STEPS (x$RUNS)" >>"$COMMANDS"
fi
echo "gemm_ceiling --batch 256 --threads $THREADS --repeats $CEILING_REPEATS (x$RUNS)" >>"$COMMANDS"
echo "OMP_NUM_THREADS=$THREADS optimizer_pass --rounds $OPTIMIZER_ROUNDS (x$RUNS)" >>"$COMMANDS"
if ((CORES >= 2)); then
  echo "OMP_NUM_THREADS=1 gemm_ceiling --batch 128 --threads 1 --precision fp32 --repeats $CEILING_REPEATS (x$RUNS)" \
    >>"$COMMANDS"
  echo "mpiexec -n 2 --bind-to core allreduce_alone --widths 1024,2048,2048,10 --repeats $CEILING_REPEATS (x$RUNS)" \
    >>"$COMMANDS"
fi
record load_rounds "$(tr '\n' ' ' <"$WORK/load.rates")"
record load_end "$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- the table ----
"$PYTHON" - "$RESULTS" <<'EOF'
import sys

values = {}
for line in open(sys.argv[1]):
    key, _, value = line.rstrip("\n").partition("=")
    values[key] = value  # the last value of a key wins


def number(key):
    try:
        return float(values.get(key, ""))
    except ValueError:
        return None


# Model sizes, from the layer widths (the same formulas docs/performance.md states).
widths = [1024, 2048, 2048, 10]
batch = 256
parameters = sum(i * o + o for i, o in zip(widths, widths[1:]))
# Matrix-product FLOPs per sample of one training step: forward, weight gradient for every layer, input gradient for
# every layer but the first; 2 FLOPs per multiply-add. gemm_ceiling times exactly these products.
gemm_flops_per_sample = 2 * sum(i * o for i, o in zip(widths, widths[1:])) * 3 - 2 * widths[0] * widths[1]
ceiling_flops = number("ceiling_flops_per_step")
if ceiling_flops:
    assert abs(ceiling_flops / batch - gemm_flops_per_sample) < 1, "gemm_ceiling timed other shapes than the model"


def memory_need(activation_bytes):
    """Bytes the step needs: fp32 parameters, gradients and AdamW's two moments; the 16-bit working copy of the
    weights in bf16; the activations kept for the backward (every layer's input and the output) and the two
    activation-gradient buffers of the widest layer, all in the activation dtype."""
    state = parameters * 4 * 4
    working = parameters * 2 if activation_bytes == 2 else 0
    kept = batch * (widths[0] + 2 * sum(widths[1:-1]) + widths[-1]) * activation_bytes
    gradients = 2 * batch * max(widths) * activation_bytes
    return state + working + kept + gradients


rows = []  # (row, hpctrain, anchor, ratio, goal, verdict)


def ratio_row(name, mine, anchor, unit, goal_text, goal_value, digits=0, anchor_missing="not measured"):
    if mine is None:
        rows.append((name, "not measured", fmt(anchor, unit, digits) if anchor else anchor_missing, "-", goal_text, "-"))
        return
    if anchor is None:
        rows.append((name, fmt(mine, unit, digits), anchor_missing, "-", goal_text, "-"))
        return
    ratio = mine / anchor
    verdict = "-" if goal_value is None else ("met" if ratio >= goal_value else "NOT met")
    rows.append((name, fmt(mine, unit, digits), fmt(anchor, unit, digits), f"{ratio:.2f}", goal_text, verdict))


def fmt(value, unit, digits=0):
    return f"{value:,.{digits}f} {unit}".strip()


hp32, hp16 = number("fp32_rate"), number("bf16_rate")
tw32, tw16 = number("twin_fp32_rate"), number("twin_bf16_rate")
c32, c16 = number("ceiling_fp32_rate"), number("ceiling_bf16_rate")
torch_anchor = "not measured (torch not installed)" if values.get("torch") == "not installed" else "not measured"
ratio_row("MLP fp32 samples/s vs PyTorch twin", hp32, tw32, "", ">= 1.5", 1.5, anchor_missing=torch_anchor)
ratio_row("MLP bf16 samples/s vs PyTorch twin", hp16, tw16, "", ">= 1.5", 1.5, anchor_missing=torch_anchor)
flops = gemm_flops_per_sample
ratio_row("MLP fp32 GFLOP/s vs oneDNN matmul", hp32 and hp32 * flops * 1e-9, c32, "", ">= 0.70", 0.70, 1)
ratio_row("MLP bf16 GFLOP/s vs oneDNN matmul", hp16 and hp16 * flops * 1e-9, c16, "", ">= 0.70", 0.70, 1)
ratio_row("bf16/fp32 speed-up vs oneDNN's", hp16 and hp32 and hp16 / hp32, c16 and c32 and c16 / c32, "x",
          "hpctrain > 1", None, 2)
if hp16 and hp32 and rows[-1][3] != "-":  # the goal is on hpctrain's own speed-up (issue 3), not on the ratio
    rows[-1] = rows[-1][:5] + ("met" if hp16 / hp32 > 1 else "NOT met",)
if tw16 and tw32:
    rows.append(("bf16/fp32 speed-up of the twin", "", f"{tw16 / tw32:.2f} x", "-", "(context)", "-"))
for precision, activation_bytes in (("fp32", 4), ("bf16", 2)):
    rss = number(f"{precision}_rss_kib")
    need = memory_need(activation_bytes) / 2**20
    ratio_row(f"peak RSS {precision} vs model state+activations", rss and rss / 1024, need, "MiB", "report", None, 1)
    base = number("baseline_rss_kib")
    if rss and base:
        ratio_row(f"  same, less the runtime baseline ({base / 1024:.0f} MiB)", (rss - base) / 1024, need, "MiB",
                  "report", None, 1)
# The optimizer phase (gradient norm + fused update, --profile) as a memory rate: the bytes it must move over its
# steady-state time, against gemm_ceiling's pass with the same traffic and trivial arithmetic.
for precision in ("fp32", "bf16"):
    optimizer_ms, traffic = number(f"{precision}_optimizer_ms"), number(f"memory_{precision}_bytes")
    ratio_row(f"optimizer phase {precision} GB/s vs same-traffic pass", optimizer_ms and traffic and
              traffic / (optimizer_ms * 1e-3) * 1e-9, number(f"memory_{precision}_rate"), "", "report", None, 1)
    ratio_row(f"  same, vs that pass with flushed caches", optimizer_ms and traffic and
              traffic / (optimizer_ms * 1e-3) * 1e-9, number(f"memory_cold_{precision}_rate"), "", "report", None, 1)
# The same phase's kernels alone (bench/optimizer_pass, alternating with the same-traffic pass in one process).
for precision in ("fp32", "bf16"):
    ratio = number(f"optimizer_{precision}_rate")
    gbps = number(f"optimizer_gbps_{precision}_rate")
    rows.append((f"optimizer kernels {precision} (optimizer_pass) vs same-traffic pass",
                 f"{gbps:.1f} GB/s" if gbps else "not measured", "-", f"{ratio:.2f}" if ratio else "-", ">= 0.80",
                 "-" if ratio is None else ("met" if ratio >= 0.8 else "NOT met")))
w1, w2 = number("weak1_rate"), number("weak2_rate")
ratio_row("weak scaling: 2 ranks vs 2 x 1 rank (128/rank)", w2, w1 and 2 * w1, "", "report", None)
phase_keys = ("data", "forward", "backward", "all-reduce", "optimizer")
steady = {key: number(f"weak2_{key}_ms") or 0.0 for key in phase_keys}
share = 100 * steady["all-reduce"] / sum(steady.values()) if sum(steady.values()) > 0 else None
rows.append(("all-reduce wait share, 2 ranks", f"{share:.1f} %" if share is not None else "not measured", "-", "-",
             "report", "-"))

print()
print(f"hpctrain benchmarks, {values['date']}; build: {values.get('build')}")
print(f"machine: {values['cpu']}, {values['cores']} cores; load average {values['load_start']} at start, "
      f"{values.get('load_end')} at end, 1-minute load at each round's start: {values.get('load_rounds')}")
print(f"threads: hpctrain 1 rank x {values['threads']} threads, PyTorch twin and gemm_ceiling {values['threads']} "
      f"threads; weak scaling 1 thread per rank")
compile_note = values.get("twin_fp32_compile", "-")
print(f"torch: {values['torch']}" + (f" (torch.compile used: {compile_note})" if values["torch"] != "not installed"
                                      else "") + f"; oneDNN {values.get('onednn')}")
if "twin_bf16_short" in values:
    print(f"bf16 twin: {values['twin_bf16_short']}")
print(f"figures: median over {values['runs']} runs; a hpctrain run's figure is its median samples/s over steps "
      f"{int(values['warmup']) + 1}..{values['steps']}, a twin run's its median over timed windows; the ceiling is the "
      f"sum of per-product medians")
print(f"model FLOPs per sample (matrix products of one step) = {gemm_flops_per_sample:,} "
      f"(6 x {parameters:,} parameters = {6 * parameters:,} is the usual approximation)")
print()
def print_table(header, table_rows):
    """A Markdown table with columns as wide as their widest cell."""
    column_widths = [max(len(str(r[i])) for r in table_rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, column_widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in column_widths) + "|")
    for r in table_rows:
        print(line(r))


print_table(("row", "hpctrain", "anchor", "ratio", "goal", ""), rows)
print()
steps, short = int(values["steps"]), 2 * int(values["warmup"])
print(f"where a step's time goes (--profile, rank 0, steady state: (phase total of a {steps}-step run - that of a "
      f"{short}-step run) / {steps - short}, median over the rounds; ms/step, share in parentheses):")
for name, label in (("fp32", "fp32 1x" + values["threads"]), ("bf16", "bf16 1x" + values["threads"]),
                    ("weak1", "fp32 1x1 b128"), ("weak2", "fp32 2x1 b256")):
    per_step = {}
    for key, phase in (("data", "data"), ("forward", "forward+loss"), ("backward", "backward"),
                       ("all-reduce", "all-reduce"), ("optimizer", "optimizer")):
        if number(f"{name}_{key}_ms") is not None:
            per_step[phase] = number(f"{name}_{key}_ms")
    total = sum(per_step.values())
    rate = number(f"{name}_rate")
    if total > 0 and rate:
        measured = (128e3 if name == "weak1" else 256e3) / rate
        print(f"  {label:14s} " + ", ".join(f"{phase} {ms:.1f} ({100 * ms / total:.0f}%)" for phase, ms in
                                              per_step.items()) + f"; sum {total:.1f} (step at the median rate {measured:.1f})")


# The roofline table (issue 17): each phase's steady-state time next to its limit on this machine, measured in the
# same rounds: forward and backward = gemm_ceiling's oneDNN products of the same shapes (summed medians) plus the
# element-wise passes' bytes at the same-traffic memory pass's rate; optimizer = that memory pass with the caches
# flushed before each repeat and the gradients read back (the state a step leaves them in; a large L3 would otherwise
# hold the whole optimizer state and the pass would measure the cache; the 2-rank run: half of it, each rank's slice of
# the sharded update); all-reduce (2
# ranks) = allreduce_alone, the same bytes in the same buckets with nothing else running. The data wait has no limit
# (0 is the goal). The step's figure is the sum of its phases over the sum of the limits (goal: <= 1.15).
def elementwise_bytes(rows, activation_bytes):
    """Element-wise traffic of one step, bytes: forward = each relu reads and writes its rows, the loss reads the
    logits and writes their gradient, a bf16 step also casts the fp32 input batch; backward = each relu's backward
    reads dy and y and writes dx, each bias gradient reads its layer's dy."""
    hidden = sum(widths[1:-1])
    forward = 2 * rows * hidden * activation_bytes + 2 * rows * widths[-1] * activation_bytes
    if activation_bytes == 2:
        forward += rows * widths[0] * (4 + 2)
    backward = 3 * rows * hidden * activation_bytes + rows * sum(widths[1:]) * activation_bytes
    return forward, backward


roof_rows = []
for name, label, rows_per_rank, activation_bytes in (("fp32", "fp32 1x" + values["threads"], 256, 4),
                                                     ("bf16", "bf16 1x" + values["threads"], 256, 2),
                                                     ("weak2", "fp32 2x1 b256", 128, 4)):
    gbps = number(f"limit_{name}_gbps")
    forward_bytes, backward_bytes = elementwise_bytes(rows_per_rank, activation_bytes)
    limits = {
        "forward+loss": number(f"limit_{name}_forward") and gbps and
        number(f"limit_{name}_forward") + forward_bytes / (gbps * 1e9) * 1e3,
        "backward": number(f"limit_{name}_backward") and gbps and
        number(f"limit_{name}_backward") + backward_bytes / (gbps * 1e9) * 1e3,
        "all-reduce": number(f"limit_{name}_allreduce") if name == "weak2" else None,
        # The 2-rank run shards the update (HPCTRAIN_MPI_OPTIMIZER=sharded, the default): each rank passes over half
        # of the state, so its limit is half the 1-core pass (a lower bound: the two ranks share the bandwidth).
        "optimizer": number(f"limit_{name}_optimizer") and
        number(f"limit_{name}_optimizer") / (2 if name == "weak2" else 1),
    }
    source = {"forward+loss": "oneDNN forward products + element-wise bytes at the pass rate",
              "backward": "oneDNN backward products + element-wise bytes at the pass rate",
              "all-reduce": "allreduce_alone: the same buckets, nothing else running",
              "optimizer": "same-traffic memory pass, caches flushed first" +
              (" (half: each rank's slice)" if name == "weak2" else ""), "data": "(none: 0 is the goal)"}
    measured, limit_sum, complete = 0.0, 0.0, True
    for key, phase in (("data", "data"), ("forward", "forward+loss"), ("backward", "backward"),
                       ("all-reduce", "all-reduce"), ("optimizer", "optimizer")):
        ms = number(f"{name}_{key}_ms")
        if ms is None or (phase == "all-reduce" and name != "weak2"):
            continue
        limit = limits.get(phase)
        measured += ms
        if ms <= 0 and phase != "data":
            complete = False  # a noisy short run: its steady-state difference came out empty
        if limit:
            limit_sum += limit
        elif phase != "data":
            complete = False
        roof_rows.append((label, phase, f"{ms:.2f}", f"{limit:.2f}" if limit else "-",
                          f"{ms / limit:.2f}" if limit else "-", source[phase]))
    if measured > 0 and limit_sum > 0 and complete:
        ratio = measured / limit_sum
        roof_rows.append((label, "step", f"{measured:.2f}", f"{limit_sum:.2f}", f"{ratio:.2f}",
                          "sum of the limits; goal <= 1.15: " + ("met" if ratio <= 1.15 else "NOT met")))
if roof_rows:
    print()
    print("roofline: each phase's steady-state ms/step (rank 0, --profile) against its limit measured in the same rounds")
    print_table(("run", "phase", "hpctrain ms", "limit ms", "ratio", "limit"), roof_rows)
EOF
echo
echo "commands (DATA and DECK are the generated data set and deck; bench/run.sh writes both):"
sed 's/^/  /' "$COMMANDS"
