#!/usr/bin/env bash
# bench/attention.sh: hpctrain's CPU fused attention kernel alone against PyTorch's F.scaled_dot_product_attention
# (issue 16), batch 4, 12 heads, head_dim 64, causal, at T = 256 and 1024, fp32 and bf16, forward and forward + backward.
#
#   bench/attention.sh                  run with build/release (build it first: cmake --build --preset release)
#   bench/attention.sh --build-dir DIR  use DIR/bin/attention_kernels
#   bench/attention.sh --rounds N       rounds (default 5); --threads N (default: the cores); --repeats N (default 20)
#   bench/attention.sh --quick          1 round, 3 repeats, T = 64: checks the harness, measures nothing
#
# Each round runs every configuration once in both programs (bench/attention_kernels: the Backend's
# attention_forward/backward; bench/sdpa_attention.py: PyTorch from bench/install-torch.sh's environment), one after
# the other, so that load from elsewhere hits both; a program's figure per round is the median over its repeats, the
# table shows the median over the rounds. "speed-up" is PyTorch's time over hpctrain's (> 1: hpctrain is faster).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/bench/lib/bench.bash"
PYTHON=${HPCTRAIN_TORCH_VENV:-$ROOT/bench/.venv}/bin/python
[[ -x $PYTHON ]] || PYTHON=/usr/bin/python3
BUILD_DIR=$ROOT/build/release
ROUNDS=5
REPEATS=20
THREADS=$(nproc)
SEQUENCES=(256 1024)
DTYPES=(fp32 bf16)
while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --quick) ROUNDS=1; REPEATS=3; SEQUENCES=(64); shift ;;
    -h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/attention.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
KERNEL=$BUILD_DIR/bin/attention_kernels
[[ -x $KERNEL ]] || { echo "bench/attention.sh: no $KERNEL; build first or pass --build-dir" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-bench-attention.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=$THREADS
HAVE_TORCH=1
"$PYTHON" -c 'import torch' 2>/dev/null || HAVE_TORCH=0
LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)

# "forward_ms F forward_backward_ms FB" -> F >> NAME.forward, FB >> NAME.both
record() { awk -v name="$1" '{print $2 >> (name ".forward"); print $4 >> (name ".both")}'; }

for ((round = 1; round <= ROUNDS; ++round)); do
  for sequence in "${SEQUENCES[@]}"; do
    for dtype in "${DTYPES[@]}"; do
      shape=(--sequence "$sequence" --batch 4 --heads 12 --head-dim 64 --dtype "$dtype" --repeats "$REPEATS")
      "$KERNEL" "${shape[@]}" | record "$WORK/hpctrain-$sequence-$dtype"
      if ((HAVE_TORCH)); then
        "$PYTHON" "$ROOT/bench/sdpa_attention.py" "${shape[@]}" --threads "$THREADS" | record "$WORK/torch-$sequence-$dtype"
      fi
    done
  done
done

echo "bench/attention.sh: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $THREADS threads,"
echo "  load average $LOAD_AT_START at start, $(cut -d' ' -f1-3 /proc/loadavg) at end (other work on the machine skews the figures)"
echo "  batch 4, 12 heads, head_dim 64, causal; medians (ms) over $ROUNDS round(s) of $REPEATS repeats; torch: $(
  ((HAVE_TORCH)) && "$PYTHON" -c 'import torch; print(torch.__version__)' || echo 'not installed (bench/install-torch.sh)')"
printf '%6s %-5s %-16s %10s %10s %9s\n' T dtype pass hpctrain torch speed-up
for sequence in "${SEQUENCES[@]}"; do
  for dtype in "${DTYPES[@]}"; do
    for pass in forward both; do
      mine=$(median_of "$WORK/hpctrain-$sequence-$dtype.$pass")
      if [[ -s $WORK/torch-$sequence-$dtype.$pass ]]; then
        theirs=$(median_of "$WORK/torch-$sequence-$dtype.$pass")
        ratio=$(awk -v a="$theirs" -v b="$mine" 'BEGIN {printf "%.2f", a / b}')
      else
        theirs="-" ratio="-"
      fi
      label=$([[ $pass == forward ]] && echo forward || echo forward+backward)
      printf '%6s %-5s %-16s %10s %10s %9s\n' "$sequence" "$dtype" "$label" "$mine" "$theirs" "$ratio"
    done
  done
done
