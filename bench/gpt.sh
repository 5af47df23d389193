#!/usr/bin/env bash
# bench/gpt.sh: training speed of GPT models on the CPU against the PyTorch twin (issue 16), in one run.
#
#   bench/gpt.sh                      run with build/release (build it first: cmake --build --preset release)
#   bench/gpt.sh --build-dir DIR      use DIR/bin/hpctrain
#   bench/gpt.sh --only gpt2|tiny     one model only (GPT-2 124M: both precisions; gpt-tiny: fp32)
#   bench/gpt.sh --fp32-only          GPT-2 in fp32 only (on CPUs without bf16 instructions PyTorch's autocast crawls)
#   bench/gpt.sh --baseline PROGRAM   also another hpctrain (an earlier build) in the same rounds: before/after
#   bench/gpt.sh --quick              1 round, few steps, the twin eager only: checks the harness, measures nothing
#
# Models, 1 rank x T threads (T = the cores, --threads):
#   - GPT-2 124M (12 layers, 12 heads, width 768, vocabulary 50,304, learned positions, the head tied to the token
#     table, GPT-2's initialisation, no dropout) at batch 4 x context 64, fp32 and bf16, AdamW (lr 6e-4, weight decay
#     0.1 except biases and norms), no gradient clipping; the deck is written here (inputs/gpt2-124m.toml is the
#     training deck, at context 1024). Data: random token ids, `hpctrain data convert --tokens --vocabulary 50304`.
#   - gpt-tiny: inputs/gpt-tiny.toml as it is (2 blocks, width 64, 4 heads, T 64, batch 16, vocabulary 256, tied head,
#     its dropout 0.2 after the embedding and its gradient clipping, which the twin has not) on GPL-3 converted by
#     `hpctrain data convert --text`, fp32.
# against bench/torch_twin.py --model gpt (nanoGPT's blocks, F.scaled_dot_product_attention, AdamW with the same
# hyper-parameters, bf16 = autocast with fp32 weights) on the same token files, --compile best: eager and
# torch.compile steps in alternating windows of one process, the faster counts (the table says which).
# Rounds alternate hpctrain and twin runs so that load from elsewhere hits both. A hpctrain run's figure is the median
# of /train/samples_per_sec (metrics.h5, one row per step) over the steps after the warm-up, so start-up, primitive
# creation and the first steps' page faults are not timed; a twin run's is its median over timed windows after its
# warm-up steps; the table shows the median over the rounds. ratio = hpctrain's tokens/s over PyTorch's.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/lib/bench.bash"
# bench/install-torch.sh's environment when it exists, else Debian's python3 (h5py, numpy).
PYTHON=${HPCTRAIN_TORCH_VENV:-$ROOT/bench/.venv}/bin/python
[[ -x $PYTHON ]] || PYTHON=/usr/bin/python3
BUILD_DIR=$ROOT/build/release
RUNS=3
THREADS=$(nproc)
GPT2_STEPS=16          # hpctrain steps per GPT-2 run; the first GPT2_WARMUP are not timed
GPT2_WARMUP=4
TINY_STEPS=200
TINY_WARMUP=20
TWIN_COMPILE=best      # --quick: off (compiling takes minutes, a smoke test measures nothing)
GPT2_TWIN=(--warmup 2 --windows 3 --window-steps 4)
TINY_TWIN=(--warmup 20 --windows 5 --window-steps 30)
MODELS=(gpt2 tiny)
GPT2_PRECISIONS=(fp32 bf16)
GPT2_LAYERS=12 GPT2_VOCABULARY=50304  # --quick: 2 layers and 2,048 ids (starts in seconds; the harness is the same)
KEEP=0
BASELINE=""
TINY_THREADS=()  # gpt-tiny runs at the deck's 1 thread and at --threads
while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --only) [[ $2 == gpt2 || $2 == tiny ]] || { echo "bench/gpt.sh: --only gpt2 or tiny" >&2; exit 2; }
      MODELS=("$2"); shift 2 ;;
    --quick) RUNS=1; GPT2_STEPS=4; GPT2_WARMUP=1; GPT2_LAYERS=2; GPT2_VOCABULARY=2048; TINY_STEPS=10; TINY_WARMUP=2; TWIN_COMPILE=off
      GPT2_TWIN=(--warmup 1 --windows 1 --window-steps 2); TINY_TWIN=(--warmup 2 --windows 2 --window-steps 3); shift ;;
    --baseline) BASELINE=$(realpath "$2"); shift 2 ;;
    --fp32-only) GPT2_PRECISIONS=(fp32); shift ;;
    --keep) KEEP=1; shift ;;
    -h | --help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/gpt.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
HPCTRAIN=$BUILD_DIR/bin/hpctrain
TINY_THREADS=(1)
((THREADS > 1)) && [[ $TWIN_COMPILE != off ]] && TINY_THREADS+=("$THREADS")  # --quick: 1 thread only
[[ -x $HPCTRAIN ]] || { echo "bench/gpt.sh: no $HPCTRAIN; build first or pass --build-dir" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-bench-gpt.XXXXXX")
if ((KEEP)); then echo "bench/gpt.sh: keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
export OMP_NUM_THREADS=$THREADS
HAVE_TORCH=1
"$PYTHON" -c 'import torch' 2>/dev/null || HAVE_TORCH=0
LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
COMMANDS=()

# ---- data and decks ----
GPT2_CONTEXT=64 GPT2_BATCH=4
GPT2_LABEL=gpt2-124m
((GPT2_LAYERS == 12 && GPT2_VOCABULARY == 50304)) || GPT2_LABEL=gpt2-quick
# 2,048 windows of 64 tokens: more than the runs read, so no epoch boundary falls inside a timed window.
/usr/bin/python3 -c "import numpy; numpy.save('$WORK/ids.npy', numpy.random.default_rng(1).integers(0, $GPT2_VOCABULARY, 2048 * $GPT2_CONTEXT + 1, dtype=numpy.int32))"
"$HPCTRAIN" data convert --tokens "$WORK/ids.npy" --vocabulary $GPT2_VOCABULARY --sequence-length $GPT2_CONTEXT \
  --output "$WORK/gpt2-tokens.h5" >/dev/null
COMMANDS+=("hpctrain data convert --tokens IDS.npy --vocabulary $GPT2_VOCABULARY --sequence-length $GPT2_CONTEXT --output gpt2-tokens.h5  (IDS: 131,073 uniform random ids)")
"$HPCTRAIN" data convert --text /usr/share/common-licenses/GPL-3 --sequence-length 64 --output "$WORK/gpl3.h5" >/dev/null
COMMANDS+=("hpctrain data convert --text /usr/share/common-licenses/GPL-3 --sequence-length 64 --output gpl3.h5")
blocks=$(for ((layer = 0; layer < GPT2_LAYERS; ++layer)); do
  echo "  { type = \"transformer_block\", heads = 12, causal = true, mlp_ratio = 4 },"
done)
cat >"$WORK/gpt2.toml" <<EOF
# GPT-2 124M ($GPT2_LAYERS layers, vocabulary $GPT2_VOCABULARY) at context $GPT2_CONTEXT (bench/gpt.sh): the twin's model,
# optimizer and batch.
[run]
seed = 1
threads = $THREADS

[data]
train = "$WORK/gpt2-tokens.h5"
batch_size = $GPT2_BATCH

[model]
init = "gpt2"
layers = [
  { type = "embedding", vocabulary = $GPT2_VOCABULARY, out = 768, positions = true },
$blocks
  { type = "layernorm" },
  { type = "linear", tie = "embedding0", bias = false },
]

[optimizer]
type = "adamw"
lr = 6e-4
weight_decay = 0.1

[train]
steps = $GPT2_STEPS
log_every = $GPT2_STEPS

[checkpoint]
at_end = false
EOF

# hpctrain_run NAME DECK WARMUP SET...: one run; appends its median samples/s to NAME.hpctrain (and one of the
# --baseline program to NAME.baseline).
hpctrain_run() {
  local name=$1 deck=$2 warmup=$3 run=$WORK/$1-$round overrides=() setting program; shift 3
  for setting in "$@"; do overrides+=(--set "$setting"); done
  for program in "$HPCTRAIN" ${BASELINE:+"$BASELINE"}; do
    local kind=hpctrain
    [[ $program == "$HPCTRAIN" ]] || kind=baseline run=$run-baseline
    "$program" train "$deck" "${overrides[@]}" --output "$run" >"$run.log" 2>&1 || { tail -20 "$run.log" >&2; exit 1; }
    median_rate "$run/metrics.h5" "$warmup" >>"$WORK/$name.$kind"
  done
  [[ -n ${COMMAND[$name]:-} ]] || COMMAND[$name]="OMP_NUM_THREADS=$OMP_NUM_THREADS hpctrain train $(basename "$deck") ${overrides[*]}"
}
# twin_run NAME ARGS...: one twin run; appends its samples/s to NAME.torch and which variant won to NAME.variant.
twin_run() {
  local name=$1 log=$WORK/$1-$round.twin; shift
  ((HAVE_TORCH)) || return 0
  "$PYTHON" "$ROOT/bench/torch_twin.py" --model gpt --threads "$THREADS" --compile "$TWIN_COMPILE" "$@" >"$log" 2>&1 ||
    { tail -20 "$log" >&2; exit 1; }
  local line
  line=$(grep '^TWIN ' "$log" | tail -1)
  sed -n 's/.* samples_per_sec=\([0-9.]*\).*/\1/p' <<<"$line" >>"$WORK/$name.torch"
  sed -n 's/.* compile=\([a-z]*\) .*/\1/p' <<<"$line" | sed 's/yes/compile/; s/no/eager/' >>"$WORK/$name.variant"
  for variant in eager compile; do
    sed -n "s/.* ${variant}_rate=\([0-9.]*\).*/\1/p" <<<"$line" >>"$WORK/$name.torch-$variant"
  done
  [[ -n ${COMMAND[$name-twin]:-} ]] ||
    COMMAND[$name-twin]="bench/torch_twin.py --model gpt --threads $THREADS --compile $TWIN_COMPILE $*"
}

declare -A COMMAND
GPT2_TWIN_MODEL=(--gpt $GPT2_LAYERS,12,768,$GPT2_CONTEXT,$GPT2_VOCABULARY --tie --batch $GPT2_BATCH --lr 6e-4 --weight-decay 0.1)
for ((round = 1; round <= RUNS; ++round)); do
  echo "bench/gpt.sh: round $round of $RUNS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  for model in "${MODELS[@]}"; do
    if [[ $model == gpt2 ]]; then
      for precision in "${GPT2_PRECISIONS[@]}"; do
        hpctrain_run gpt2-$precision "$WORK/gpt2.toml" $GPT2_WARMUP precision.mode=$precision
        twin_run gpt2-$precision "${GPT2_TWIN_MODEL[@]}" --precision $precision --data "$WORK/gpt2-tokens.h5" \
          "${GPT2_TWIN[@]}"
      done
    else
      for threads in "${TINY_THREADS[@]}"; do
        OMP_NUM_THREADS=$threads hpctrain_run tiny-${threads}t "$ROOT/inputs/gpt-tiny.toml" $TINY_WARMUP \
          "data.train=$WORK/gpl3.h5" 'data.validation=""' train.eval_every=0 train.steps=$TINY_STEPS \
          train.log_every=$TINY_STEPS run.threads=$threads checkpoint.at_end=false
        OMP_NUM_THREADS=$threads THREADS=$threads twin_run tiny-${threads}t --gpt 2,4,64,64,256 --tie --batch 16 \
          --lr 3e-3 --weight-decay 0.1 --precision fp32 --data "$WORK/gpl3.h5" "${TINY_TWIN[@]}"
      done
    fi
  done
done

echo "bench/gpt.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), 1 rank x $THREADS threads,"
echo "  load average $LOAD_AT_START at start, $(cut -d' ' -f1-3 /proc/loadavg) at end (other work on the machine skews the figures)"
echo "  $RUNS round(s); hpctrain: median step after the warm-up; torch: $(
  ((HAVE_TORCH)) && "$PYTHON" -c 'import torch; print(torch.__version__)' || echo 'not installed (bench/install-torch.sh)'),"
echo "  --compile $TWIN_COMPILE (eager and torch.compile windows alternating, the faster median counts)"
printf '%-11s %-7s %7s | %9s %10s | %9s %10s %-14s | %6s %s\n' model mode "B x T" "hpctrain" "tokens/s" "torch" \
  "tokens/s" "(eager/comp.)" ratio goal
for model in "${MODELS[@]}"; do
  if [[ $model == gpt2 ]]; then names=("${GPT2_PRECISIONS[@]/#/gpt2-}") batch=$GPT2_BATCH context=$GPT2_CONTEXT goal=">= 1.30"
  else names=("${TINY_THREADS[@]/#/tiny-}") names=("${names[@]/%/t}") batch=16 context=64 goal=report; fi
  for name in "${names[@]}"; do
    mine=$(median_of "$WORK/$name.hpctrain")
    mine_step=$(awk -v r="$mine" -v b=$batch 'BEGIN {printf "%.3f s", b / r}')
    mine_tokens=$(awk -v r="$mine" -v t=$context 'BEGIN {printf "%.0f", r * t}')
    if [[ -s $WORK/$name.torch ]]; then
      theirs=$(median_of "$WORK/$name.torch")
      theirs_step=$(awk -v r="$theirs" -v b=$batch 'BEGIN {printf "%.3f s", b / r}')
      theirs_tokens=$(awk -v r="$theirs" -v t=$context 'BEGIN {printf "%.0f", r * t}')
      variants="$(sort "$WORK/$name.variant" | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}')"
      split=""
      for variant in eager compile; do
        if [[ -s $WORK/$name.torch-$variant ]]; then
          split+=$(awk -v r="$(median_of "$WORK/$name.torch-$variant")" -v b=$batch 'BEGIN {printf "%.2f", b / r}')
        else
          split+=-
        fi
        [[ $variant == compile ]] || split+=/
      done
      ratio=$(awk -v a="$mine" -v b="$theirs" 'BEGIN {printf "%.2f", a / b}')
    else
      theirs="" theirs_step="-" theirs_tokens="not measured" split="" variants="" ratio="-"
    fi
    label=("$GPT2_LABEL" "${name##*-}")
    [[ $name == tiny-* ]] && label=(gpt-tiny "fp32 ${name#tiny-}")
    printf '%-11s %-7s %7s | %9s %10s | %9s %10s %-14s | %6s %s\n' "${label[@]}" "$batch x $context" \
      "$mine_step" "$mine_tokens" "$theirs_step" "$theirs_tokens" "($split)" "$ratio" "$goal"
    [[ -n $variants ]] && echo "              torch's faster variant per round: $variants"
    if [[ -s $WORK/$name.baseline ]]; then
      before=$(median_of "$WORK/$name.baseline")
      awk -v r="$before" -v b=$batch -v t=$context -v now="$mine" -v theirs="${theirs:-0}" 'BEGIN {
        printf "              baseline %.3f s/step, %.0f tokens/s: this build is %.2fx as fast", b / r, r * t, now / r
        if (theirs > 0) printf "; baseline/torch = %.2f", r / theirs
        printf "\n" }'
    fi
  done
done
echo
echo "s/step = batch / samples/s; (eager/comp.): the twin's s/step of each variant (median over the rounds)."
[[ -n $BASELINE ]] && echo "baseline: $BASELINE (run right after this build's run in every round)"
echo "commands (gpt2.toml is the deck this script writes):"
for line in "${COMMANDS[@]}"; do echo "  $line"; done
for key in "${!COMMAND[@]}"; do echo "  $key: ${COMMAND[$key]}"; done | sed "s|$WORK/||g" | sort
