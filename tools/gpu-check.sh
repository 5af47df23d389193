#!/usr/bin/env bash
# Everything GPU-side in one go, on a machine with a GPU (about 8 minutes on one H200 before the GPT-2 124M rows,
# which add an estimated 2-4, not measured yet; HPCTRAIN_GPU_CHECK_SECONDS skips what would start too late): the CUDA
# kernel tests against the CPU backend (and one large shape per kernel, the fused and copy-stream paths, graph slots),
# the tensor-core attention kernels against the reference kernels and f64 (and timed beside them and PyTorch's SDPA),
# compute-sanitizer (memcheck, racecheck, synccheck) where installed, the device gradient all-reduce on 1 and 2 ranks
# (with a captured graph and the trainer's teardown order), 20 training steps on run.device = cuda against the same
# deck on the CPU (fp32 and bf16, 1 rank; fp32 on 2 ranks; with class weights and label smoothing; linear + relu /
# gelu(tanh) pairs folded into the products' epilogues forward and backward; residual adds folded into products;
# attention dropout), 20 steps of CNNs and of a vision transformer the same way (16-bit ones channels-last, fp32 ones
# channels-first, each row checking the layout its run reports), an fp16 loss-scale trajectory against the CPU's, a
# bf16 deck of odd widths with batches over 8 MiB, CUDA graphs with evaluation, a checkpoint and --resume against the
# eager run bit for bit, predict/evaluate on cuda against the CPU (features and token data), two identical runs
# diffed, hpctrain generate with the key/value cache against --no-cache, --profile phases from CUDA events, the
# throughput of a GEMM-bound bf16 MLP against the cuBLASLt ceiling and its PyTorch twin (bench/torch_twin.py, when
# torch with CUDA is installed), GPT-2 124M in bf16 at batch 16 x context 1024 (tokens/s, model FLOP utilisation)
# against its twin, and with 2 or more GPUs 2-rank NCCL runs with and without graphs. Prints a table at the end; exits
# non-zero when a check failed.
#
#   tools/gpu-check.sh                 uses .device/rt.tar.xz (tools/pack-gpu.sh) when present, else build-gpu/
#   HPCTRAIN_BIN=DIR tools/gpu-check.sh   takes the programs from DIR (hpctrain and the test programs; the CUDA
#                                         module from DIR/../lib, or wherever HPCTRAIN_CUDA_MODULE points)
#   HPCTRAIN_GPU_CHECK_SECONDS=S          starts no timed check after S seconds (they are listed as SKIP, out of time),
#                                         so that a leased machine's time limit still ends with the table
#   HPCTRAIN_GPU_CHECK_LOGS=DIR           leaves every check's log in DIR/gpu-check-logs.tar.xz
#
# Without a GPU (nvidia-smi missing or listing none) it checks nothing and exits 77 (skipped).
# Test programs run directly, not through CTest: CTest's files hold the build machine's absolute paths. Bit-for-bit
# comparisons of metrics and checkpoints use h5diff (packed by tools/pack-gpu.sh).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu-check: no GPU here (nvidia-smi lists none): nothing checked" >&2
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-gpu-check.XXXXXX")
keep_logs() { # the logs into $HPCTRAIN_GPU_CHECK_LOGS (when set), then the work folder removed
  if [[ -n ${HPCTRAIN_GPU_CHECK_LOGS:-} ]]; then
    mkdir -p "$HPCTRAIN_GPU_CHECK_LOGS" &&
      (cd "$work" && find . -maxdepth 1 -name '*.log' -print0 | tar cJf "$HPCTRAIN_GPU_CHECK_LOGS/gpu-check-logs.tar.xz" --null -T -)
  fi
  rm -rf "$work"
}
trap keep_logs EXIT

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
  # tools/pack-gpu.sh packs the CUDA module beside the programs (pack.sh puts everything it is given in bin/); they
  # look for it in lib/ beside bin/, as in an installed tree.
  [[ -f $rt/bin/libhpctrain_cuda.so ]] && mv "$rt/bin/libhpctrain_cuda.so" "$rt/lib/"
fi
hpctrain=$(find_program hpctrain) || { echo "gpu-check: no hpctrain program (run tools/pack-gpu.sh)" >&2; exit 2; }
mpiexec_line=(mpiexec --oversubscribe)
[[ $(id -u) == 0 ]] && mpiexec_line+=(--allow-run-as-root)

rows=() failures=0 out_of_time=0
record() { # record NAME RESULT SECONDS DETAIL (a check whose command timed() did not start is a SKIP)
  local result=$2 detail=$4
  if ((out_of_time)); then
    result=SKIP detail="out of time (HPCTRAIN_GPU_CHECK_SECONDS=$HPCTRAIN_GPU_CHECK_SECONDS)"
    out_of_time=0
  fi
  rows+=("$(printf '%-36s %-7s %6ss  %s' "$1" "$result" "$3" "$detail")")
  [[ $result == FAIL ]] && failures=$((failures + 1))
  echo "== $1: $result ($3 s) $detail"
}
timed() { # timed SECONDS_VAR COMMAND...: runs, stores the wall seconds, returns the status; past the deadline, runs
  # nothing and returns 125
  local -n seconds_out=$1; shift
  local begin=$SECONDS status=0
  if [[ -n ${HPCTRAIN_GPU_CHECK_SECONDS:-} ]] && ((SECONDS >= HPCTRAIN_GPU_CHECK_SECONDS)); then
    out_of_time=1 seconds_out=0
    return 125
  fi
  "$@" || status=$?
  seconds_out=$((SECONDS - begin))
  return $status
}

echo "== machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
echo "== hpctrain: $hpctrain"

# ---- 0. the CUDA module: hpctrain links no CUDA library and opens the module, which sees the GPUs ----
cuda_line=$("$hpctrain" --version 2>&1 | sed -n 's/^  CUDA: *//p')
cuda_needed=$(readelf -d "$hpctrain" 2>/dev/null | grep -oE '\[lib(cudart|cublas|cublasLt|cudnn|nccl)[^]]*\]' | tr '\n' ' ')
if [[ -n $cuda_needed ]]; then
  record "CUDA module" FAIL 0 "hpctrain links CUDA libraries: $cuda_needed"
elif [[ $cuda_line == "module "*"), "[1-9]*" device(s) visible" ]]; then
  record "CUDA module" PASS 0 "$cuda_line"
else
  record "CUDA module" FAIL 0 "${cuda_line:-no CUDA line in hpctrain --version}"
fi

# ---- 1. kernels against the CPU backend; large shapes, fused and copy-stream paths, graph slots ----
gtest_result() { # gtest_result LOG STATUS: PASS / FAIL / SKIP and the summary
  if (($2 == 77)); then echo "SKIP"; elif (($2 == 0)); then echo "PASS"; else echo "FAIL"; fi
}
gtest_row() { # gtest_row NAME PROGRAM TIMEOUT [ARGS...]
  local name=$1 program=$2 limit=$3 status=0 log="$work/$2.log"
  shift 3
  if ! program=$(find_program "$program"); then record "$name" FAIL 0 "$(basename "$log" .log) not found"; return; fi
  timed seconds timeout "$limit" "$program" --gtest_color=no "$@" >"$log" 2>&1 || status=$?
  record "$name" "$(gtest_result "$log" $status)" "$seconds" \
    "$( ((status == 124)) && echo "timeout ${limit}s; ")$(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$log" | tr -s ' ' | tr '\n' ' ')"
  ((status != 0 && status != 77)) && grep -E "Failure|Expected|Which is|error|FAILED" "$log" | head -40
}
spatial_tests='CudaVsCpu.Convolution*:CudaVsCpu.Pooling*:CudaVsCpu.Groupnorm*:CudaVsCpu.SpatialLayout*'
gtest_row "cuda kernels vs CPU" cuda_kernels_test 240 --gtest_filter="-$spatial_tests"
# Issue 15, item 11: convolutions (bias fused, mixed-precision weight gradients), pooling, groupnorm and the layout
# conversion in both layouts, bf16/fp16/fp32, poisoned outputs, against the CPU in the same layout.
gtest_row "conv/pool/groupnorm channels-last and -first vs CPU" cuda_kernels_test 180 --gtest_filter="$spatial_tests"
# Issue 16: fused attention (forward, deterministic backward) and the embedding lookup/gradient against the CPU.
gtest_row "attention, embedding vs CPU" cuda_attention_test 120
# Issue 16: the tensor-core attention kernels (HPCTRAIN_CUDA_ATTENTION=tensor_core) against the reference kernels and
# an f64 reference: bf16/fp16, causal and not, T 1..1024, head_dim 32/64/128, dQ/dK/dV apart, identical bits twice.
gtest_row "tensor-core attention vs reference, f64" cuda_tensor_core_attention_test 180
# ... and their time beside the reference kernels and PyTorch's SDPA (batch 16, 12 heads, head_dim 64, T 1024, bf16,
# causal; medians of 5 windows).
if program=$(find_program cuda_throughput_test); then
  status=0
  timed seconds timeout 120 "$program" --gtest_color=no --gtest_filter='CudaAttentionTiming.*' \
    >"$work/attention-timing.log" 2>&1 || status=$?
  timing=$(grep '^ATTENTION' "$work/attention-timing.log" | head -1)
  if ((status == 0)) && [[ -n $timing ]]; then
    field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
    detail="fwd/fwd+bwd: tensor_core $(field tensor_core_forward_ms "$timing")/$(field tensor_core_forward_backward_ms "$timing") ms"
    detail+=", reference $(field reference_forward_ms "$timing")/$(field reference_forward_backward_ms "$timing") ms"
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      sdpa=$(timeout 120 python3 "$root/bench/sdpa_cuda.py" 2>&1 | grep '^SDPA' | head -1)
      detail+=", torch SDPA ${sdpa:+$(field forward_ms "$sdpa")/$(field forward_backward_ms "$sdpa") ms}${sdpa:-failed}"
    else
      detail+=", torch SDPA: no torch with CUDA"
    fi
    record "attention timing b16 h12 T1024 bf16" INFO "$seconds" "$detail"
  else
    record "attention timing b16 h12 T1024 bf16" FAIL "$seconds" "exit $status: $(tail -1 "$work/attention-timing.log")"
    [[ $status != 125 ]] && tail -20 "$work/attention-timing.log"
  fi
else
  record "attention timing" FAIL 0 "cuda_throughput_test not found"
fi
# >= 70,000 rows / >= 4,096 columns per kernel, BGRADB, uploads, graph slots, scratch growing after a capture,
# bookkeeping replays, event timing, TF32
gtest_row "large shapes, fused, uploads, graphs" cuda_paths_test 240 \
  --gtest_filter=-CudaPaths.LinearWithReluFoldedIntoTheProduct:CudaPaths.LinearActivationPairs*:CudaPaths.LinearResidual*
# Issue 15, item 9: linear + relu in one product (RELU_BIAS / RELU epilogue, and the odd-shape fallback) against the
# CPU, a NaN row kept NaN. The training rows below run it too (their decks pair linear and relu).
gtest_row "linear+relu epilogue vs CPU" cuda_paths_test 120 --gtest_filter=CudaPaths.LinearWithReluFoldedIntoTheProduct
# Issue 15, item 9: the pairs' forward with aux (RELU_AUX_BIAS mask, GELU_AUX_BIAS input) and their backward in the
# next product (DRELU, DGELU), fp32/bf16/fp16, widths taking each path, NaN rows kept NaN, against the CPU.
gtest_row "linear+relu/gelu(tanh) backward epilogues vs CPU" cuda_paths_test 180 \
  --gtest_filter='CudaPaths.LinearActivationPairs*'
# Issue 16: the residual add as the product's C operand (beta = 1, bias epilogue), fp32/bf16/fp16, aligned and odd
# shapes, against the CPU's fused product.
gtest_row "linear + residual add vs CPU" cuda_paths_test 120 --gtest_filter='CudaPaths.LinearResidual*'

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

# ---- data for the training checks ----
cd "$work"
"$hpctrain" data generate spirals --samples 16384 --classes 3 --noise 0.05 --seed 1 --output train.h5 >/dev/null
"$hpctrain" data generate spirals --samples 2048 --classes 3 --noise 0.05 --seed 2 --output validation.h5 >/dev/null
# ---- 3. training on cuda against the CPU ----
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
# Issue 15, item 9: a deck of linear + relu and linear + gelu(tanh) pairs, each followed by a linear layer (forward
# epilogues RELU_AUX_BIAS / GELU_AUX_BIAS, backward DRELU / DGELU); the log must say the pairs were folded.
pairs='model.layers=[{type="linear", out=256}, {type="relu"}, {type="linear", out=128}, {type="gelu", approximate="tanh"}, {type="linear", out=64}, {type="relu"}, {type="linear", out=3}]'
for mode in fp32 bf16; do
  tolerance=1e-3
  [[ $mode == bf16 ]] && tolerance=3e-2
  name="linear+relu/gelu(tanh) pairs, $mode, cuda vs cpu"
  train cpu-pairs-$mode.log 1 --set run.device=cpu --set precision.mode=$mode --set "$pairs" --output cpu-pairs-$mode || true
  status=0
  timed seconds train cuda-pairs-$mode.log 1 --set run.device=cuda --set precision.mode=$mode --set "$pairs" \
    --output cuda-pairs-$mode || status=$?
  if ((status != 0)); then
    record "$name" FAIL "$seconds" "exit $status: $(grep 'error' cuda-pairs-$mode.log | head -1)"
    tail -20 cuda-pairs-$mode.log
  elif ! grep -q "3 linear + activation pair(s)" cuda-pairs-$mode.log; then
    record "$name" FAIL "$seconds" "the log does not report 3 folded pairs"
  else
    compare_losses "$name" cpu-pairs-$mode.log cuda-pairs-$mode.log $tolerance "$seconds"
  fi
done
# Class weights and label smoothing (the smoothed cross-entropy kernel, the per-step sum of the labels' weights).
weighted=(--set "model.class_weights=[0.5,2.0,1.25]" --set model.label_smoothing=0.1)
train cpu-weighted.log 1 --set run.device=cpu "${weighted[@]}" --output cpu-weighted || true
status=0
timed seconds train cuda-weighted.log 1 --set run.device=cuda "${weighted[@]}" --output cuda-weighted || status=$?
if ((status != 0)); then
  record "train 20 steps, class weights, cuda" FAIL "$seconds" "exit $status: $(grep 'error' cuda-weighted.log | head -1)"
  tail -20 cuda-weighted.log
else
  compare_losses "train 20 steps, class weights, cuda" cpu-weighted.log cuda-weighted.log 1e-3 "$seconds"
fi

# ---- 3b. convolutional networks on cuda against the CPU (cuDNN convolutions, pooling and groupnorm kernels) ----
"$hpctrain" data generate images --samples 4000 --seed 1 --output images.h5 >/dev/null
"$hpctrain" data generate volumes --samples 640 --size 16 --channels 2 --seed 1 --output volumes.h5 >/dev/null
"$hpctrain" data generate images --samples 1280 --size 32 --channels 3 --classes 8 --seed 1 --output images32.h5 \
  >/dev/null
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
# vit-small (issue 16): a patch conv2d, to_sequence (class token, positions), non-causal attention in 2 transformer
# blocks, sequence_pool: the to_sequence kernels and the encoder on cuda, its patch conv channels-last in bf16.
# Issue 15, item 11: 16-bit models run their conv stacks channels-last on cuda (NHWC / NDHWC cuDNN descriptors, KRSC
# filters, the fused bias, 16-bit inputs into fp32 weight gradients, channels-last pooling and groupnorm); fp32 ones
# channels-first. Each row's name says the layout its cuda run must report (the model's summary line), checked too.
for case in "cnn2d fp32 $root/inputs/cnn2d.toml images.h5 1e-3" "cnn2d bf16 $root/inputs/cnn2d.toml images.h5 3e-2" \
  "cosmoflow-small fp32 $root/inputs/cosmoflow-small.toml volumes.h5 1e-3" \
  "cosmoflow-small bf16 $root/inputs/cosmoflow-small.toml volumes.h5 3e-2" "cnn-norm fp32 cnn-norm.toml images.h5 1e-3" \
  "cnn-norm fp16 cnn-norm.toml images.h5 3e-2" "vit-small fp32 $root/inputs/vit-small.toml images32.h5 1e-3" \
  "vit-small bf16 $root/inputs/vit-small.toml images32.h5 3e-2"; do
  read -r log_name mode deck data tolerance <<<"$case"
  layout=channels-first
  [[ $mode != fp32 ]] && layout=channels-last
  name="$log_name $mode $layout, cuda vs cpu"
  cnn "$deck" "$data" cpu "$mode" >"cnn-$log_name-cpu-$mode.log" 2>&1 || true
  status=0
  timed seconds cnn "$deck" "$data" cuda "$mode" >"cnn-$log_name-cuda-$mode.log" 2>&1 || status=$?
  reported=channels-first
  grep -q "conv layers run channels-last" "cnn-$log_name-cuda-$mode.log" && reported=channels-last
  if ((status != 0)); then
    record "$name" FAIL "$seconds" "exit $status: $(grep error "cnn-$log_name-cuda-$mode.log" | head -1)"
    tail -20 "cnn-$log_name-cuda-$mode.log"
  elif [[ $reported != "$layout" ]]; then
    record "$name" FAIL "$seconds" "the cuda run reports $reported"
  else
    compare_losses "$name" "cnn-$log_name-cpu-$mode.log" "cnn-$log_name-cuda-$mode.log" "$tolerance" "$seconds"
  fi
done

# ---- 3b'. the attention layer (issue 16) on cuda against the CPU: embedding with positions -> attention ->
# layernorm -> linear on a byte-level text (GPL-3, or this repository's design notes where the licence is absent) ----
text=/usr/share/common-licenses/GPL-3
[[ -r $text ]] || text=$root/docs/design.md
"$hpctrain" data convert --text "$text" --sequence-length 64 --output text.h5 >/dev/null
cat >attention.toml <<'TOML'
[run]
seed = 3
[data]
train = "text.h5"
batch_size = 16
[model]
layers = [ { type = "embedding", vocabulary = 256, out = 64, positions = true }, { type = "attention", heads = 4 },
           { type = "layernorm" }, { type = "linear", out = 256 } ]
[optimizer]
lr = 0.003
[train]
steps = 20
log_every = 1
TOML
for mode in fp32 bf16; do
  tolerance=1e-3
  [[ $mode == bf16 ]] && tolerance=3e-2
  name="attention layer 20 steps, $mode, cuda vs cpu"
  timeout 240 "$hpctrain" train attention.toml --set run.device=cpu --set precision.mode=$mode \
    --output attention-cpu-$mode >attention-cpu-$mode.log 2>&1 || true
  status=0
  timed seconds timeout 240 "$hpctrain" train attention.toml --set run.device=cuda --set precision.mode=$mode \
    --output attention-cuda-$mode >attention-cuda-$mode.log 2>&1 || status=$?
  if ((status != 0)); then
    record "$name" FAIL "$seconds" "exit $status: $(grep error attention-cuda-$mode.log | head -1)"
    tail -20 attention-cuda-$mode.log
  else
    compare_losses "$name" attention-cpu-$mode.log attention-cuda-$mode.log $tolerance "$seconds"
  fi
done
# Attention dropout: both backends drop the same probabilities (the mask is a function of seed, step, layer, sample,
# head, query and key), so the losses agree as closely as without dropout.
name="attention dropout 0.1, 20 steps, fp32, cuda vs cpu"
timeout 240 "$hpctrain" train attention.toml --set run.device=cpu --set 'model.layers[1].dropout=0.1' \
  --output attention-dropout-cpu >attention-dropout-cpu.log 2>&1 || true
status=0
timed seconds timeout 240 "$hpctrain" train attention.toml --set run.device=cuda --set 'model.layers[1].dropout=0.1' \
  --output attention-dropout-cuda >attention-dropout-cuda.log 2>&1 || status=$?
if ((status != 0)); then
  record "$name" FAIL "$seconds" "exit $status: $(grep error attention-dropout-cuda.log | head -1)"
  tail -20 attention-dropout-cuda.log
else
  compare_losses "$name" attention-dropout-cpu.log attention-dropout-cuda.log 1e-3 "$seconds"
fi
# The same layer on the tensor-core kernels (HPCTRAIN_CUDA_ATTENTION=tensor_core) inside a training step: one head of
# 64 (a head_dim they cover), bf16 and fp16 against the CPU.
one_head='model.layers=[{type="embedding", vocabulary=256, out=64, positions=true}, {type="attention", heads=1}, {type="layernorm"}, {type="linear", out=256}]'
for mode in bf16 fp16; do
  name="attention 20 steps, tensor cores, $mode vs cpu"
  timeout 240 "$hpctrain" train attention.toml --set run.device=cpu --set precision.mode=$mode --set "$one_head" \
    --output tc-cpu-$mode >tc-cpu-$mode.log 2>&1 || true
  status=0
  timed seconds env HPCTRAIN_CUDA_ATTENTION=tensor_core timeout 240 "$hpctrain" train attention.toml \
    --set run.device=cuda --set precision.mode=$mode --set "$one_head" --output tc-cuda-$mode >tc-cuda-$mode.log 2>&1 ||
    status=$?
  if ((status != 0)); then
    record "$name" FAIL "$seconds" "exit $status: $(grep error tc-cuda-$mode.log | head -1)"
    tail -20 tc-cuda-$mode.log
  elif ! grep -q "attention on tensor cores" tc-cuda-$mode.log; then
    record "$name" FAIL "$seconds" "the log's backend line does not say 'attention on tensor cores'"
  else
    compare_losses "$name" tc-cpu-$mode.log tc-cuda-$mode.log 3e-2 "$seconds"
  fi
done

# hpctrain generate on cuda (issue 16): the key/value cache (Backend::cached_attention's kernel, the cache in device
# memory) against recomputing the window (--no-cache), from the attention runs' checkpoints above: sampled, top-k and
# greedy, 10 + 90 tokens (the window of 64 slides), the same text required, and no fallback notice on stderr.
generate_cached_vs_recomputed() { # MODE: prints the first difference; returns 1 on one
  local mode=$1 options run=0 f
  for options in "--seed 1" "--seed 2 --top-k 5 --temperature 0.7" "--temperature 0"; do
    run=$((run + 1))
    f="generate-$mode-$run"
    # shellcheck disable=SC2086
    timeout 120 "$hpctrain" generate "attention-cuda-$mode" --device cuda --prompt "Copyright " --max-new-tokens 90 \
      $options >"$f-cached.txt" 2>"$f-cached.err" || { echo "cached: exit $?"; return 1; }
    grep -q "without the key/value cache" "$f-cached.err" && { echo "fell back: $(head -1 "$f-cached.err")"; return 1; }
    # shellcheck disable=SC2086
    timeout 120 "$hpctrain" generate "attention-cuda-$mode" --device cuda --prompt "Copyright " --max-new-tokens 90 \
      $options --no-cache >"$f-recomputed.txt" 2>&1 || { echo "--no-cache: exit $?"; return 1; }
    cmp -s "$f-cached.txt" "$f-recomputed.txt" ||
      { echo "$options: $(cmp "$f-cached.txt" "$f-recomputed.txt" | head -1)"; return 1; }
  done
  echo "3 option sets, 100 tokens each: the same text; e.g. $(head -c 40 "generate-$mode-1-cached.txt" | tr -c '[:print:]' ' ')..."
}
for mode in fp32 bf16; do
  name="generate cache vs --no-cache, $mode"
  if [[ ! -d attention-cuda-$mode ]]; then
    [[ -n ${HPCTRAIN_GPU_CHECK_SECONDS:-} ]] && ((SECONDS >= HPCTRAIN_GPU_CHECK_SECONDS)) && out_of_time=1
    record "$name" FAIL 0 "no checkpoint: the attention run ($mode, cuda) above failed"
    continue
  fi
  status=0
  timed seconds generate_cached_vs_recomputed "$mode" >"generate-$mode.log" 2>&1 || status=$?
  record "$name" "$( ((status == 0)) && echo PASS || echo FAIL)" "$seconds" "$(tail -1 "generate-$mode.log")"
done

# ---- 3c. determinism, the fp16 loss-scale trajectory, odd widths with batches over 8 MiB ----
h5same() { # h5same A.h5 B.h5 OBJECT...: every named dataset/group identical bit for bit (h5diff, no tolerance)
  local a=$1 b=$2 object
  shift 2
  command -v h5diff >/dev/null || { echo "no h5diff"; return 2; }
  for object in "$@"; do h5diff -q "$a" "$b" "$object" "$object" >/dev/null 2>&1 || { echo "$object differs"; return 1; }; done
}
# Two identical runs of a CNN (cuDNN's algorithm choices must be deterministic): section 3b's cnn2d fp32 run and one
# more.
status=0
seconds=0
if [[ -f out-cnn2d-cuda-fp32/metrics.h5 ]]; then
  mv out-cnn2d-cuda-fp32 cnn-first
  timed seconds cnn "$root/inputs/cnn2d.toml" images.h5 cuda fp32 >cnn-again.log 2>&1 || status=$?
else
  status=1
  [[ -n ${HPCTRAIN_GPU_CHECK_SECONDS:-} ]] && ((SECONDS >= HPCTRAIN_GPU_CHECK_SECONDS)) && out_of_time=1
fi
if ((status != 0)); then
  record "determinism: two identical runs" FAIL "$seconds" "exit $status (or no first run)"
elif detail=$(h5same cnn-first/metrics.h5 out-cnn2d-cuda-fp32/metrics.h5 /train/loss /train/grad_norm); then
  record "determinism: two identical runs" PASS "$seconds" \
    "cnn2d fp32, 20 steps: losses and gradient norms identical; $(grep -c 'NOT deterministic' cnn-again.log) non-deterministic cuDNN choices logged"
else
  record "determinism: two identical runs" "$([[ $detail == 'no h5diff' ]] && echo SKIP || echo FAIL)" "$seconds" "$detail"
fi

# fp16 with a huge initial scale (about 25 skipped steps halve it into range) and a short growth interval (it then
# grows into overflow and backs off again): the steps skipped and the scale of each step must match the CPU's exactly
# (the scaler runs on the device, read back in windows of 7 steps).
for device in cpu cuda; do
  timeout 120 "$hpctrain" train deck.toml --set run.device=$device --set precision.mode=fp16 \
    --set precision.init_scale=1e12 --set precision.growth_interval=3 --set train.steps=60 --set train.log_every=7 \
    --set 'model.layers=[{type="linear", out=64}, {type="gelu"}, {type="linear", out=3}]' \
    --output "fp16-$device" >"fp16-$device.log" 2>&1
done
if detail=$(h5same fp16-cpu/metrics.h5 fp16-cuda/metrics.h5 /train/skipped /train/loss_scale); then
  record "fp16 scale trajectory vs cpu" PASS 0 "skipped steps and loss scales of 60 steps identical"
else
  record "fp16 scale trajectory vs cpu" "$([[ $detail == 'no h5diff' ]] && echo SKIP || echo FAIL)" 0 "$detail"
  tail -5 fp16-cpu.log fp16-cuda.log
fi

# bf16, widths that are not multiples of 8 (odd leading dimensions: cuBLASLt alignment, unvectorised element-wise
# tails), and batches of 2304 x 1001 fp32 features = 9.2 MB per step: the upload goes through the copy stream.
"$hpctrain" data generate blobs --samples 4608 --features 1001 --classes 10 --noise 20 --seed 3 --output wide.h5 \
  >/dev/null
cat >wide.toml <<'TOML'
[run]
seed = 2
[data]
train = "wide.h5"
batch_size = 2304
[model]
layers = [
  { type = "linear", out = 777 }, { type = "layernorm" }, { type = "relu" }, { type = "linear", out = 333 },
  { type = "gelu" }, { type = "linear", out = 10 },
]
[precision]
mode = "bf16"
[optimizer]
type = "adamw"
lr = 0.001
[train]
steps = 20
log_every = 1
TOML
timeout 240 "$hpctrain" train wide.toml --set run.device=cpu --output wide-cpu >wide-cpu.log 2>&1 || true
status=0
timed seconds timeout 120 "$hpctrain" train wide.toml --set run.device=cuda --output wide-cuda >wide-cuda.log 2>&1 ||
  status=$?
if ((status != 0)); then
  record "bf16 odd widths, 9 MB batches" FAIL "$seconds" "exit $status: $(grep error wide-cuda.log | head -1)"
  tail -20 wide-cuda.log
else
  compare_losses "bf16 odd widths, 9 MB batches" wide-cpu.log wide-cuda.log 3e-2 "$seconds"
fi

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
# With class weights the graph reads each step's sum of the labels' weights from memory: replay = eager exactly.
weighted_small=(--set train.steps=100 --set "model.class_weights=[0.5,2.0,1.25]" --set model.label_smoothing=0.1)
status=0
timed seconds_eager timeout 120 "$hpctrain" train small.toml "${weighted_small[@]}" --output eager-weighted \
  >eager-weighted.log 2>&1 || status=$?
timed seconds_graph timeout 120 "$hpctrain" train small.toml "${weighted_small[@]}" --set run.cuda_graphs=true \
  --output graph-weighted >graph-weighted.log 2>&1 || status=$?
name="cuda graphs with class weights"
if ((status != 0)); then
  record "$name" FAIL "$((seconds_eager + seconds_graph))" \
    "exit $status: $(grep -h error eager-weighted.log graph-weighted.log | head -1)"
elif python3 -c 'import h5py' 2>/dev/null; then
  python3 -c 'import h5py, numpy, sys; a, b = (h5py.File(f + "/metrics.h5", "r")["/train/loss"][:] for f in ("eager-weighted", "graph-weighted")); sys.exit(0 if len(a) == 100 and numpy.array_equal(a, b) else 1)' &&
    grep -q "captured after" graph-weighted.log && result=PASS || result=FAIL
  record "$name" $result "$((seconds_eager + seconds_graph))" "100 steps: replayed losses identical to eager"
else
  record "$name" SKIP "$((seconds_eager + seconds_graph))" "no h5py"
fi

# Graphs with evaluation every 50 steps (its own captured forward), a checkpoint at step 100 and a --resume from it:
# metrics and the final checkpoint must equal the eager run's bit for bit.
graph_sets=(--set data.validation=validation.h5 --set train.eval_every=50 --set checkpoint.every_steps=100
  --set train.log_every=50)
status=0
timed seconds timeout 120 "$hpctrain" train small.toml "${graph_sets[@]}" --set train.steps=200 --output eval-eager \
  >eval-eager.log 2>&1 || status=$?
timeout 120 "$hpctrain" train small.toml "${graph_sets[@]}" --set train.steps=100 --set run.cuda_graphs=true \
  --output eval-graph >eval-graph-1.log 2>&1 || status=$?
timeout 120 "$hpctrain" train small.toml "${graph_sets[@]}" --set train.steps=200 --set run.cuda_graphs=true \
  --output eval-graph --resume auto >eval-graph-2.log 2>&1 || status=$?
name="cuda graphs + eval + resume vs eager"
if ((status != 0)); then
  record "$name" FAIL "$seconds" "exit $status: $(grep -h error eval-*.log | head -1)"
  tail -10 eval-graph-2.log
elif detail=$(h5same eval-eager/metrics.h5 eval-graph/metrics.h5 /train/loss /train/grad_norm /eval/loss /eval/accuracy &&
  h5same eval-eager/checkpoints/step-00000200.h5 eval-graph/checkpoints/step-00000200.h5 /model /optimizer); then
  if grep -q "resumed from" eval-graph-2.log && grep -q "captured after" eval-graph-2.log; then
    record "$name" PASS "$seconds" "200 steps, 4 evaluations, resumed at 100: metrics and checkpoint identical"
  else
    record "$name" FAIL "$seconds" "the graph run did not resume or capture"
  fi
else
  record "$name" "$([[ $detail == 'no h5diff' ]] && echo SKIP || echo FAIL)" "$seconds" "$detail"
fi

# predict and evaluate (issue 15, item 16) on cuda, with --device overriding the deck, against the CPU on the eager
# run's final checkpoint: 32 batches of the validation set, so the captured forward pass is replayed 30 times.
# Tolerances: the same weights on both, so only the forward pass's rounding differs (fp32, TF32 off).
name="predict/evaluate on cuda vs cpu"
checkpoint=eval-eager/checkpoints/step-00000200.h5
status=0
for device in cpu cuda; do
  timeout 120 "$hpctrain" predict "$checkpoint" --data validation.h5 --device $device --output "predict-$device.h5" \
    >"predict-$device.log" 2>&1 || status=$?
  timeout 120 "$hpctrain" evaluate "$checkpoint" --data validation.h5 --device $device \
    --output "evaluate-$device.h5" >"evaluate-$device.log" 2>&1 || status=$?
done
timed seconds timeout 120 "$hpctrain" predict "$checkpoint" --data validation.h5 --device auto \
  --output predict-auto.h5 >predict-auto.log 2>&1 || status=$?
if ((status != 0)); then
  record "$name" FAIL "$seconds" "exit $status: $(grep -h error predict-*.log evaluate-*.log | head -1)"
elif grep -q "on the CPU" predict-auto.log; then
  record "$name" FAIL "$seconds" "--device auto fell back to the CPU: $(head -1 predict-auto.log)"
elif ! command -v h5diff >/dev/null; then
  record "$name" SKIP "$seconds" "no h5diff"
elif h5diff -d 1e-4 predict-cpu.h5 predict-cuda.h5 /predictions /predictions >predict-diff.log 2>&1 &&
  h5diff -d 1e-5 predict-cpu.h5 predict-cuda.h5 /probabilities /probabilities >>predict-diff.log 2>&1 &&
  h5diff -d 1e-5 evaluate-cpu.h5 evaluate-cuda.h5 /eval/loss /eval/loss >>predict-diff.log 2>&1 &&
  h5diff -d 2e-3 evaluate-cpu.h5 evaluate-cuda.h5 /eval/accuracy /eval/accuracy >>predict-diff.log 2>&1 &&
  h5same predict-cuda.h5 predict-auto.h5 /predictions >/dev/null; then
  record "$name" PASS "$seconds" "2048 samples: logits within 1e-4, loss within 1e-5 of the CPU; auto = cuda"
else
  record "$name" FAIL "$seconds" "$(head -3 predict-diff.log | tr '\n' ' ')"
fi

# predict and evaluate on token data (issue 16) on cuda against the CPU: the fp32 attention model of section 3b' on its
# text, every position of every window scored; the same weights on both, so only the forward pass's rounding differs.
name="GPT predict/evaluate cuda vs cpu"
checkpoint=attention-cpu-fp32/checkpoints/step-00000020.h5
status=0
seconds=0
if [[ ! -f $checkpoint ]]; then
  status=1
else
  for device in cpu cuda; do
    timed seconds timeout 120 "$hpctrain" predict "$checkpoint" --data text.h5 --device $device \
      --output "predict-text-$device.h5" >"predict-text-$device.log" 2>&1 || status=$?
    timeout 120 "$hpctrain" evaluate "$checkpoint" --data text.h5 --device $device \
      --output "evaluate-text-$device.h5" >"evaluate-text-$device.log" 2>&1 || status=$?
  done
fi
if ((status != 0)); then
  record "$name" FAIL "$seconds" "exit $status (or no checkpoint): $(grep -h error predict-text-*.log evaluate-text-*.log | head -1)"
elif ! command -v h5diff >/dev/null; then
  record "$name" SKIP "$seconds" "no h5diff"
elif h5diff -d 1e-5 evaluate-text-cpu.h5 evaluate-text-cuda.h5 /eval/loss /eval/loss >predict-text-diff.log 2>&1 &&
  h5diff -d 1e-3 predict-text-cpu.h5 predict-text-cuda.h5 /target_log_probabilities /target_log_probabilities \
    >>predict-text-diff.log 2>&1 &&
  h5diff predict-text-cpu.h5 predict-text-cuda.h5 /targets /targets >>predict-text-diff.log 2>&1; then
  # argmax may flip where two logits are within rounding: at most 0.1% of the positions
  differing=$(h5diff predict-text-cpu.h5 predict-text-cuda.h5 /next_tokens /next_tokens 2>/dev/null |
    sed -n 's/^\([0-9]*\) differences\? found$/\1/p')
  positions=$(sed -n 's/.*windows, \([0-9]*\) positions scored.*/\1/p' evaluate-text-cpu.log)
  if ((${differing:-0} * 1000 <= ${positions:-0})); then
    record "$name" PASS "$seconds" "$positions positions: loss within 1e-5, log p within 1e-3, ${differing:-0} argmaxes differ"
  else
    record "$name" FAIL "$seconds" "${differing} of ${positions:-?} argmaxes differ"
  fi
else
  record "$name" FAIL "$seconds" "$(head -3 predict-text-diff.log | tr '\n' ' ')"
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

# The step's GEMM rate against cuBLASLt's on the same products (goal >= 60%), and the optimizer's bandwidth against
# the copy bandwidth; the optimizer phase from an eager --profile run (a replayed graph has no phases inside it),
# timed on CUDA events.
ceiling=""
if program=$(find_program cuda_throughput_test); then
  timeout 120 "$program" --gtest_color=no --gtest_filter='-CudaAttentionTiming.*' >ceiling.log 2>&1 || true
  ceiling=$(grep '^CEILING' ceiling.log | head -1)
fi
status=0
timed seconds timeout 180 "$hpctrain" train bench.toml --set run.cuda_graphs=false --set train.steps=60 \
  --set train.log_every=20 --profile --output profile >profile.log 2>&1 || status=$?
if ((status != 0)) || ! grep -q "device time from CUDA events" profile.log; then
  record "--profile on CUDA events" FAIL "$seconds" "exit $status; $(grep -m1 '^profile' profile.log)"
  tail -20 profile.log
else
  phases=$(awk '/^profile/ { on = 1; next } on && NF >= 4 { printf "%s%s %s ms, ", $1, ($2 ~ /^[0-9.]+$/ ? "" : " " $2), $(NF - 1) }' \
    profile.log)
  record "--profile on CUDA events" PASS "$seconds" "per step: ${phases%, }"
fi
if [[ -n $ceiling && ${rate:-} && ${parameters:-} ]]; then
  gemm_ceiling=$(sed -n 's/.*gemm_tflops=\([0-9.]*\).*/\1/p' <<<"$ceiling")
  copy_gbs=$(sed -n 's/.*copy_gbs=\([0-9.]*\).*/\1/p' <<<"$ceiling")
  share=$(awk -v t="$tflops" -v c="$gemm_ceiling" 'BEGIN { printf "%.2f", (c > 0 ? t / c : 0) }')
  result=$(awk -v s="$share" 'BEGIN { print (s >= 0.6 ? "PASS" : "INFO") }')
  record "GEMM TFLOP/s vs cuBLASLt ceiling" "$result" 0 "$tflops of $gemm_ceiling TFLOP/s = $share (goal 0.6)"
  # AdamW with a bf16 working copy: reads parameter, gradient, two moments (16 B), writes parameter and moments
  # (12 B) and the bf16 copy (2 B): 30 bytes per parameter.
  optimizer_ms=$(awk '/^profile/ { on = 1; next } on && $1 == "optimizer" { print $(NF - 1) }' profile.log)
  gbs=$(awk -v p="$parameters" -v ms="${optimizer_ms:-0}" 'BEGIN { if (ms > 0) printf "%.0f", 30 * p / (ms / 1e3) / 1e9; else print 0 }')
  record "optimizer GB/s vs copy bandwidth" INFO 0 \
    "$gbs of $copy_gbs GB/s = $(awk -v a="$gbs" -v b="$copy_gbs" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') (${optimizer_ms:-?} ms/step)"
else
  record "GEMM TFLOP/s vs cuBLASLt ceiling" SKIP 0 "no ceiling measured ($(tail -1 ceiling.log 2>/dev/null))"
fi

# ---- 5a. throughput: GPT-2 124M (issue 16) at batch 16 x context 1024, bf16, against its PyTorch twin ----
# Tokens/s and model FLOP utilisation: FLOPs per token = 6 N + 12 L T C (N: hpctrain's parameter count, the tied table
# once and the position table included; 12 L T C: the attention scores and weighted values, forward and backward,
# counted over the full T x T as nanoGPT's and PaLM's estimates do), over the H200's dense bf16 peak of 989 TFLOP/s.
# Goals (issue 16): >= 1.2x the twin (autocast bf16, torch.compile) and >= 45% MFU. Random ids over the whole
# vocabulary (Python's standard library writes the .npy: numpy need not be here).
gpt_layers='[{type="embedding", vocabulary=50304, out=768, positions=true},'
for ((layer = 0; layer < 12; ++layer)); do gpt_layers+=' {type="transformer_block", heads=12, causal=true},'; done
gpt_layers+=' {type="layernorm"}, {type="linear", tie="embedding0", bias=false}]'
cat >gpt2.toml <<TOML
[run]
seed = 1
device = "cuda"
[data]
train = "gpt2-tokens.h5"
batch_size = 16
[model]
init = "gpt2"
layers = $gpt_layers
[precision]
mode = "bf16"
[optimizer]
type = "adamw"
lr = 6e-4
weight_decay = 0.1
[train]
steps = 50
log_every = 10
[checkpoint]
at_end = false
TOML
gpt_peak_tflops=989
name="hpctrain GPT-2 124M bf16, b 16 x 1024"
status=0
if ! python3 - gpt2-ids.npy <<'PY' >gpt2-data.log 2>&1; then
import array, random, struct, sys
count = 64 * 16 * 1024 + 1  # 64 batches of 16 windows of 1024 tokens, and the last target
generator = random.Random(1)
ids = array.array("i", (generator.randrange(50304) for _ in range(count)))
header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % count
header += " " * (63 - (10 + len(header)) % 64) + "\n"
with open(sys.argv[1], "wb") as file:
    file.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + ids.tobytes())
PY
  status=1
fi
((status == 0)) && "$hpctrain" data convert --tokens gpt2-ids.npy --vocabulary 50304 --sequence-length 1024 \
  --output gpt2-tokens.h5 >>gpt2-data.log 2>&1 || status=1
if ((status != 0)); then
  record "$name" FAIL 0 "no token data: $(tail -1 gpt2-data.log)"
else
  timed seconds timeout 300 "$hpctrain" train gpt2.toml --output gpt2 >gpt2.log 2>&1 || status=$?
  if ((status == 0)); then
    gpt_rate=$(sed -n 's/.* \([0-9.]*\) samples\/s (median).*/\1/p' gpt2.log)
    gpt_parameters=$(sed -n 's/.*total parameters: *\([0-9]*\).*/\1/p' gpt2.log | head -1)
    # flops per token = 6 N + 12 L T C with L = 12, T = 1024, C = 768
    gpt_flops=$(awk -v n="${gpt_parameters:-0}" 'BEGIN { printf "%.0f", 6 * n + 12 * 12 * 1024 * 768 }')
    gpt_tokens=$(awk -v r="${gpt_rate:-0}" 'BEGIN { printf "%.0f", r * 1024 }')
    gpt_mfu=$(awk -v t="$gpt_tokens" -v f="$gpt_flops" -v p=$gpt_peak_tflops 'BEGIN { printf "%.1f", 100 * t * f / (p * 1e12) }')
    record "$name" "$(awk -v m="$gpt_mfu" 'BEGIN { print (m >= 45 ? "PASS" : "INFO") }')" "$seconds" \
      "$gpt_tokens tokens/s, MFU $gpt_mfu% (goal 45%; (6 x $gpt_parameters + 12 L T C) flops/token over $gpt_peak_tflops TFLOP/s)"
    twin=$root/bench/torch_twin.py
    if [[ -f $twin ]] && python3 -c 'import torch, h5py, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      status=0
      timed seconds timeout 400 python3 "$twin" --model gpt --gpt 12,12,768,1024,50304 --tie --device cuda \
        --precision bf16 --batch 16 --data gpt2-tokens.h5 --lr 6e-4 --weight-decay 0.1 --warmup 10 --windows 5 \
        --window-steps 10 >gpt2-twin.log 2>&1 || status=$?
      twin_rate=$(sed -n 's/^TWIN .*samples_per_sec=\([0-9.]*\).*/\1/p' gpt2-twin.log)
      if ((status == 0)) && [[ -n $twin_rate ]]; then
        twin_tokens=$(awk -v r="$twin_rate" 'BEGIN { printf "%.0f", r * 1024 }')
        ratio=$(awk -v a="$gpt_tokens" -v b="$twin_tokens" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
        twin_mfu=$(awk -v t="$twin_tokens" -v f="$gpt_flops" -v p=$gpt_peak_tflops 'BEGIN { printf "%.1f", 100 * t * f / (p * 1e12) }')
        record "GPT-2 124M twin (compile, autocast)" "$(awk -v r="$ratio" 'BEGIN { print (r >= 1.2 ? "PASS" : "INFO") }')" \
          "$seconds" "$twin_tokens tokens/s, MFU $twin_mfu%; hpctrain/torch = ${ratio}x (goal 1.2x); $(grep -o 'compile=[a-z]*' gpt2-twin.log)"
      else
        record "GPT-2 124M twin (compile, autocast)" FAIL "$seconds" "exit $status; $(tail -1 gpt2-twin.log)"
      fi
    else
      record "GPT-2 124M twin (compile, autocast)" SKIP 0 "no python3 torch with CUDA and h5py here"
    fi
  else
    record "$name" FAIL "$seconds" "exit $status: $(grep error gpt2.log | head -1)"
    tail -20 gpt2.log
  fi
fi

# ---- 5b. compute-sanitizer over the kernel tests and a 5-step run (where the tool is installed); last, since it is
# the slowest and least likely to be reached within a leased machine's time ----
cd "$work"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -n $sanitizer ]] && program=$(find_program cuda_kernels_test); then
  # memcheck over every kernel but cuDNN's (slow under the tool, and not ours); racecheck and synccheck over the
  # kernels with shared memory, warp shuffles and barriers (the attention kernels' shared tiles included).
  for case in "kernels memcheck CudaVsCpu.*:-*Convolution*" \
    "kernels racecheck *Layernorm*:*SoftmaxCrossEntropy*:*BiasGradient*:*GradientStatistics*:*Groupnorm*:*MeanSquared*" \
    "kernels synccheck *Layernorm*:*SoftmaxCrossEntropy*:*BiasGradient*:*GradientStatistics*:*Groupnorm*:*MeanSquared*" \
    "attention memcheck CudaVsCpu.*" "attention racecheck CudaVsCpu.*" \
    "tensor_core_attention memcheck TensorCoreAttention.*" \
    "tensor_core_attention racecheck TensorCoreAttention.Short*"; do
    read -r suite tool filter <<<"$case"
    program=$(find_program "cuda_${suite}_test") || { record "compute-sanitizer $tool, $suite" FAIL 0 "not found"; continue; }
    status=0
    timed seconds timeout 150 "$sanitizer" --tool "$tool" --error-exitcode 99 "$program" --gtest_color=no \
      "--gtest_filter=$filter" >"sanitizer-$suite-$tool.log" 2>&1 || status=$?
    result=$(gtest_result "sanitizer-$suite-$tool.log" $status)
    record "compute-sanitizer $tool, $suite" "$result" "$seconds" \
      "$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "sanitizer-$suite-$tool.log" | tail -1)$( ((status == 124)) && echo ' (timeout)')"
    [[ $result == FAIL ]] && grep -m 20 -E "=========  |Failure" "sanitizer-$suite-$tool.log"
  done
  printf '[data]\ntrain = "train.h5"\nvalidation = "validation.h5"\nbatch_size = 128\n[model]\nlayers = [{ type = "linear", out = 64 }, { type = "layernorm" }, { type = "gelu" }, { type = "linear", out = 3 }]\n[train]\nsteps = 5\nlog_every = 1\n' >sanitize.toml
  status=0
  timed seconds timeout 180 "$sanitizer" --tool memcheck --error-exitcode 99 "$hpctrain" train sanitize.toml \
    --set run.device=cuda --set precision.mode=bf16 --output sanitize >sanitizer-run.log 2>&1 || status=$?
  result=PASS
  ((status != 0)) && result=FAIL
  record "compute-sanitizer memcheck, 5 steps" $result "$seconds" \
    "exit $status; $(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' sanitizer-run.log | tail -1)"
  [[ $result == FAIL ]] && tail -30 sanitizer-run.log
else
  record "compute-sanitizer" SKIP 0 "compute-sanitizer not installed"
fi

# ---- 6. with 2 or more GPUs: 2-rank NCCL runs, eager and with graphs, that name NCCL and exit in time ----
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if ((gpus >= 2)); then
  for graphs in false true; do
    status=0
    name="2 ranks NCCL, cuda_graphs=$graphs"
    timed seconds timeout 120 "${mpiexec_line[@]}" -n 2 "$hpctrain" train deck.toml --set run.device=cuda \
      --set run.cuda_graphs=$graphs --set 'model.layers=[{type="linear", out=256}, {type="layernorm"}, {type="gelu"}, {type="linear", out=3}]' \
      --output "nccl-$graphs" >"nccl-$graphs.log" 2>&1 || status=$?
    if ((status == 124)); then
      record "$name" FAIL "$seconds" "did not exit within 120 s (teardown hang?)"
    elif ((status != 0)); then
      record "$name" FAIL "$seconds" "exit $status: $(grep error "nccl-$graphs.log" | head -1)"
    elif grep -q "all-reduced with NCCL" "nccl-$graphs.log"; then
      record "$name" PASS "$seconds" "$(grep -o 'done: .*' "nccl-$graphs.log" | cut -c1-80)"
    else
      record "$name" FAIL "$seconds" "log does not name NCCL: $(grep -o 'all-reduced with [^,]*' "nccl-$graphs.log")"
    fi
  done
else
  record "2 ranks NCCL (eager, graphs)" SKIP 0 "$gpus GPU(s) here: needs 2 (2 ranks on one GPU go through the host)"
fi

echo
echo "hpctrain GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
printf '%-36s %-7s %7s  %s\n' check result time detail
printf '%s\n' "${rows[@]}"
((failures == 0)) || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
