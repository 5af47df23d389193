#!/usr/bin/env bash
# Everything GPU-side in one go, on a machine with a GPU (under 5 minutes on one H200): the CUDA kernel tests against
# the CPU backend, the device gradient all-reduce on 1 and 2 ranks, 20 training steps on run.device = cuda against the
# same deck on the CPU (fp32 and bf16, 1 rank; fp32 on 2 ranks), 20 steps of CNNs the same way (inputs/cnn2d.toml,
# inputs/cosmoflow-small.toml, a deck with groupnorm, average pooling and grouped/dilated convolutions), CUDA graph
# replay against eager steps, and the throughput of a GEMM-bound bf16 MLP against its PyTorch twin
# (bench/torch_twin.py, when torch with CUDA is installed). Prints a table at the end; exits non-zero when a check
# failed.
#
#   tools/gpu-check.sh                 uses .device/rt.tar.xz (tools/pack-gpu.sh) when present, else build-gpu/
#   HPCTRAIN_BIN=DIR tools/gpu-check.sh   takes the programs from DIR (hpctrain and the test programs)
#
# Test programs run directly, not through CTest: CTest's files hold the build machine's absolute paths.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

# ---- the programs ----
find_program() { # find_program NAME: the first of $HPCTRAIN_BIN, the unpacked archive, build-gpu/{bin,tests}
  local dir
  for dir in ${HPCTRAIN_BIN:-} ${rt:+$rt/bin} "$root/build-gpu/bin" "$root/build-gpu/tests"; do
    [[ -x $dir/$1 ]] && { echo "$dir/$1"; return; }
  done
  return 1
}
rt=""
if [[ -z ${HPCTRAIN_BIN:-} && -f $root/.device/rt.tar.xz ]]; then
  rt=$work/rt
  mkdir -p "$rt" && tar xJf "$root/.device/rt.tar.xz" -C "$rt" || { echo "cannot unpack .device/rt.tar.xz" >&2; exit 2; }
  # shellcheck disable=SC1091
  source "$rt/env.sh"
fi
hpctrain=$(find_program hpctrain) || { echo "gpu-check: no hpctrain program (run tools/pack-gpu.sh)" >&2; exit 2; }
mpiexec_line=(mpiexec --oversubscribe)
[[ $(id -u) == 0 ]] && mpiexec_line+=(--allow-run-as-root)

rows=() failures=0
record() { # record NAME RESULT SECONDS DETAIL
  rows+=("$(printf '%-34s %-7s %6ss  %s' "$1" "$2" "$3" "$4")")
  [[ $2 == FAIL ]] && failures=$((failures + 1))
  echo "== $1: $2 ($3 s) $4"
}
timed() { # timed SECONDS_VAR COMMAND...: runs, stores the wall seconds, returns the status
  local -n seconds_out=$1; shift
  local begin=$SECONDS status=0
  "$@" || status=$?
  seconds_out=$((SECONDS - begin))
  return $status
}

echo "== machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
echo "== hpctrain: $hpctrain"

# ---- 1. kernels against the CPU backend ----
gtest_result() { # gtest_result LOG STATUS: PASS / FAIL / SKIP and the summary
  if (($2 == 77)); then echo "SKIP"; elif (($2 == 0)); then echo "PASS"; else echo "FAIL"; fi
}
if program=$(find_program cuda_kernels_test); then
  status=0
  timed seconds timeout 240 "$program" --gtest_color=no >"$work/kernels.log" 2>&1 || status=$?
  summary="$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$work/kernels.log" | tr -s ' ' | tr '\n' ' ')"
  record "cuda kernels vs CPU" "$(gtest_result "$work/kernels.log" $status)" "$seconds" "$summary"
  ((status != 0 && status != 77)) && grep -E "Failure|Expected|Which is|error|FAILED" "$work/kernels.log" | head -40
else
  record "cuda kernels vs CPU" FAIL 0 "cuda_kernels_test not found"
fi

# ---- 2. device gradient all-reduce (NCCL, or through the host when ranks share a GPU) ----
if program=$(find_program device_allreduce_mpi_test); then
  for ranks in 1 2; do
    status=0
    timed seconds timeout 120 "${mpiexec_line[@]}" -n $ranks "$program" --gtest_color=no >"$work/allreduce-$ranks.log" 2>&1 || status=$?
    record "gradient all-reduce, $ranks rank(s)" "$(gtest_result "$work/allreduce-$ranks.log" $status)" "$seconds" \
      "$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$work/allreduce-$ranks.log" | tr -s ' ' | tr '\n' ' ')"
    ((status != 0 && status != 77)) && tail -30 "$work/allreduce-$ranks.log"
  done
else
  record "gradient all-reduce" FAIL 0 "device_allreduce_mpi_test not found"
fi

# ---- 3. training on cuda against the CPU ----
cd "$work"
"$hpctrain" data generate spirals --samples 16384 --classes 3 --noise 0.05 --seed 1 --output train.h5 >/dev/null
"$hpctrain" data generate spirals --samples 2048 --classes 3 --noise 0.05 --seed 2 --output validation.h5 >/dev/null
cat >deck.toml <<'TOML'
[run]
seed = 5
[data]
train = "train.h5"
validation = "validation.h5"
batch_size = 256
[model]
layers = [
  { type = "linear", out = 256 }, { type = "layernorm" }, { type = "gelu" }, { type = "dropout", p = 0.1 },
  { type = "linear", out = 256 }, { type = "relu" }, { type = "linear", out = 128 }, { type = "tanh" },
  { type = "linear", out = 3 },
]
[optimizer]
type = "adamw"
lr = 0.003
weight_decay = 0.01
grad_clip = 1.0
[train]
steps = 20
log_every = 1
TOML
losses() { sed -n 's/^step *[0-9]*\/.* loss \([^ ]*\) .*/\1/p' "$1"; }
# compare_losses NAME CPU_LOG GPU_LOG TOLERANCE: the largest relative difference of the per-step losses
compare_losses() {
  local name=$1 worst
  worst=$(paste <(losses "$2") <(losses "$3") | awk -v n=20 '
    { if ($1 != $1 + 0 || $2 != $2 + 0) { bad = 1 } d = $1 - $2; if (d < 0) d = -d; r = d / ($1 > 0 ? $1 : -$1)
      if (r > worst) worst = r; count++ }
    END { if (bad || count != n) print "nan"; else printf "%.2e", worst }')
  if [[ $worst != nan ]] && awk -v w="$worst" -v t="$4" 'BEGIN { exit !(w <= t) }'; then
    record "$name" PASS "$5" "max relative loss difference $worst (tolerance $4)"
  else
    record "$name" FAIL "$5" "max relative loss difference $worst (tolerance $4)"
    tail -5 "$2" "$3"
  fi
}
train() { # train LOG RANKS ARGS...
  local log=$1 ranks=$2; shift 2
  if ((ranks == 1)); then timeout 240 "$hpctrain" train deck.toml "$@" >"$log" 2>&1
  else timeout 240 "${mpiexec_line[@]}" -n "$ranks" "$hpctrain" train deck.toml "$@" >"$log" 2>&1; fi
}
for mode in fp32 bf16; do
  tolerance=1e-3
  [[ $mode == bf16 ]] && tolerance=3e-2
  train cpu-$mode.log 1 --set run.device=cpu --set precision.mode=$mode --output cpu-$mode || true
  status=0
  timed seconds train cuda-$mode.log 1 --set run.device=cuda --set precision.mode=$mode --output cuda-$mode || status=$?
  if ((status != 0)); then
    record "train 20 steps, $mode, cuda vs cpu" FAIL "$seconds" "exit $status: $(grep 'error' cuda-$mode.log | head -1)"
    tail -20 cuda-$mode.log
  else
    compare_losses "train 20 steps, $mode, cuda vs cpu" cpu-$mode.log cuda-$mode.log $tolerance "$seconds"
  fi
done
status=0
timed seconds train cuda-2ranks.log 2 --set run.device=cuda --output cuda-2ranks || status=$?
if ((status != 0)); then
  record "train 20 steps, fp32, 2 ranks cuda" FAIL "$seconds" "exit $status: $(grep 'error' cuda-2ranks.log | head -1)"
  tail -20 cuda-2ranks.log
else
  compare_losses "train 20 steps, fp32, 2 ranks cuda" cpu-fp32.log cuda-2ranks.log 1e-3 "$seconds"
  grep -o "gradients all-reduced with [^,]*" cuda-2ranks.log | head -1
fi

# ---- 3b. convolutional networks on cuda against the CPU (cuDNN convolutions, pooling and groupnorm kernels) ----
"$hpctrain" data generate images --samples 4000 --seed 1 --output images.h5 >/dev/null
"$hpctrain" data generate volumes --samples 640 --size 16 --channels 2 --seed 1 --output volumes.h5 >/dev/null
# Grouped, strided and dilated convolutions, groupnorm, average and global average pooling (cnn2d and
# cosmoflow-small cover max pooling and 3-D convolutions).
cat >cnn-norm.toml <<'TOML'
[run]
seed = 3
[data]
train = "images.h5"
batch_size = 64
[model]
layers = [
  { type = "conv2d", out = 8, kernel = 3, padding = 1 }, { type = "groupnorm", groups = 4 }, { type = "relu" },
  { type = "avgpool2d", kernel = 2 }, { type = "conv2d", out = 16, kernel = 3, padding = 2, dilation = 2, groups = 2 },
  { type = "gelu" }, { type = "conv2d", out = 16, kernel = 3, stride = 2, padding = 1 }, { type = "groupnorm", groups = 1 },
  { type = "tanh" }, { type = "global_avgpool" }, { type = "linear", out = 4 },
]
[optimizer]
type = "adamw"
lr = 0.003
[train]
steps = 20
log_every = 1
TOML
cnn() { # cnn DECK DATA DEVICE MODE: 20 steps of a CNN deck (the inputs/ decks get the data and step count set)
  local sets=(--set run.device="$3" --set precision.mode="$4" --set train.log_every=1)
  [[ $1 == "$root"/inputs/* ]] &&
    sets+=(--set data.train="$2" --set data.validation="$2" --set train.epochs=0 --set train.steps=20)
  timeout 240 "$hpctrain" train "$1" "${sets[@]}" --output "out-$(basename "$1" .toml)-$3-$4"
}
for case in "cnn2d fp32 $root/inputs/cnn2d.toml images.h5 1e-3" "cnn2d bf16 $root/inputs/cnn2d.toml images.h5 3e-2" \
  "cosmoflow-small fp32 $root/inputs/cosmoflow-small.toml volumes.h5 1e-3" "cnn-norm fp32 cnn-norm.toml images.h5 1e-3" \
  "cnn-norm fp16 cnn-norm.toml images.h5 3e-2"; do
  read -r log_name mode deck data tolerance <<<"$case"
  name="$log_name $mode, cuda vs cpu"
  cnn "$deck" "$data" cpu "$mode" >"cnn-$log_name-cpu-$mode.log" 2>&1 || true
  status=0
  timed seconds cnn "$deck" "$data" cuda "$mode" >"cnn-$log_name-cuda-$mode.log" 2>&1 || status=$?
  if ((status != 0)); then
    record "$name" FAIL "$seconds" "exit $status: $(grep error "cnn-$log_name-cuda-$mode.log" | head -1)"
    tail -20 "cnn-$log_name-cuda-$mode.log"
  else
    compare_losses "$name" "cnn-$log_name-cpu-$mode.log" "cnn-$log_name-cuda-$mode.log" "$tolerance" "$seconds"
  fi
done

# ---- 4. CUDA graphs: replay must give exactly the eager losses, and be faster for a small model ----
cat >small.toml <<'TOML'
[run]
seed = 9
device = "cuda"
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [
  { type = "linear", out = 64 }, { type = "layernorm" }, { type = "gelu" }, { type = "linear", out = 64 },
  { type = "relu" }, { type = "linear", out = 3 },
]
[optimizer]
type = "adamw"
lr = 0.003
[train]
steps = 600
log_every = 100
TOML
status=0
timed seconds_eager timeout 120 "$hpctrain" train small.toml --output eager >eager.log 2>&1 || status=$?
timed seconds_graph timeout 120 "$hpctrain" train small.toml --set run.cuda_graphs=true --output graph >graph.log 2>&1 ||
  status=$?
if ((status != 0)); then
  record "cuda graphs: replay vs eager" FAIL "$((seconds_eager + seconds_graph))" \
    "exit $status: $(grep -h error eager.log graph.log | head -1)"
  tail -10 graph.log
else
  identical=unknown
  if python3 -c 'import h5py' 2>/dev/null; then
    python3 -c 'import h5py, numpy, sys; a, b = (h5py.File(f + "/metrics.h5", "r")["/train/loss"][:] for f in ("eager", "graph")); sys.exit(0 if numpy.array_equal(a, b) else 1)' && identical=yes || identical=no
  else  # no h5py here: the logged losses (5 decimals)
    diff <(losses eager.log) <(losses graph.log) >/dev/null && identical=yes-in-log || identical=no
  fi
  rate_eager=$(sed -n 's/.* \([0-9]*\) samples\/s (median).*/\1/p' eager.log)
  rate_graph=$(sed -n 's/.* \([0-9]*\) samples\/s (median).*/\1/p' graph.log)
  speedup=$(awk -v a="${rate_eager:-0}" -v b="${rate_graph:-0}" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "?" }')
  result=PASS
  [[ $identical == no ]] && result=FAIL
  grep -q "captured after" graph.log || result=FAIL
  record "cuda graphs: replay vs eager" $result "$((seconds_eager + seconds_graph))" \
    "losses identical: $identical; $rate_graph vs $rate_eager samples/s = ${speedup}x (goal 2x)"
fi

# ---- 5. throughput: a GEMM-bound MLP in bf16, hpctrain against its PyTorch twin (when torch with CUDA is here) ----
cat >bench.toml <<'TOML'
[run]
seed = 1
device = "cuda"
cuda_graphs = true
[data]
train = "train.h5"
batch_size = 8192
[model]
layers = [
  { type = "linear", out = 4096 }, { type = "relu" }, { type = "linear", out = 4096 }, { type = "relu" },
  { type = "linear", out = 4096 }, { type = "relu" }, { type = "linear", out = 3 },
]
[precision]
mode = "bf16"
[optimizer]
type = "adamw"
lr = 1e-4
weight_decay = 0.01
[train]
steps = 200
log_every = 40
TOML
status=0
timed seconds timeout 240 "$hpctrain" train bench.toml --output bench >bench.log 2>&1 || status=$?
if ((status == 0)); then
  rate=$(sed -n 's/.* \([0-9]*\) samples\/s (median).*/\1/p' bench.log)
  # 6 FLOPs per parameter and sample (forward 2, backward 4); parameters from the log's summary
  parameters=$(sed -n 's/.*total parameters: *\([0-9]*\).*/\1/p' bench.log | head -1)
  tflops=$(awk -v r="${rate:-0}" -v p="${parameters:-0}" 'BEGIN { printf "%.1f", 6 * p * r / 1e12 }')
  record "hpctrain bf16 MLP 3x4096, b 8192" INFO "$seconds" "$rate samples/s, ~$tflops TFLOP/s (6 x $parameters params)"
  twin=$root/bench/torch_twin.py
  if [[ -f $twin ]] && python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    status=0
    timed seconds timeout 240 python3 "$twin" --device cuda --precision bf16 --widths 2,4096,4096,4096,3 \
      --batch 8192 --samples 16384 --warmup 20 --windows 5 --window-steps 40 >twin.log 2>&1 || status=$?
    twin_rate=$(sed -n 's/^TWIN .*samples_per_sec=\([0-9.]*\).*/\1/p' twin.log)
    if ((status == 0)) && [[ -n $twin_rate ]]; then
      ratio=$(awk -v a="${rate:-0}" -v b="$twin_rate" 'BEGIN { printf "%.2f", a / b }')
      record "PyTorch twin (compile, autocast)" INFO "$seconds" \
        "$twin_rate samples/s; hpctrain/torch = ${ratio}x (goal 1.2x); $(grep -o 'compile=[a-z]*' twin.log)"
    else
      record "PyTorch twin (compile, autocast)" FAIL "$seconds" "exit $status; $(tail -1 twin.log)"
    fi
  else
    record "PyTorch twin (compile, autocast)" SKIP 0 "no python3 torch with CUDA here"
  fi
else
  record "hpctrain bf16 MLP 3x4096, b 8192" FAIL "$seconds" "exit $status: $(grep error bench.log | head -1)"
  tail -20 bench.log
fi

echo
echo "hpctrain GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
printf '%-34s %-7s %7s  %s\n' check result time detail
printf '%s\n' "${rows[@]}"
((failures == 0)) || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
