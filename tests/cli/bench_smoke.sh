#!/usr/bin/env bash
# The benchmark harnesses that docs/performance.md and docs/data.md quote still run and print their tables: each in
# its smallest mode (a check of the scripts, not a measurement; their figures here mean nothing).
#   bench/data_pipeline.sh --quick, bench/checkpoint_bandwidth.sh 1 (REPEATS=1), bench/run.sh --quick,
#   bench/weak_scaling.sh --rounds 1 --steps 25 (2 cores and more),
#   bench/cnn.sh --quick (with bench/spatial_kernels --quick), bench/augmentation.sh --quick,
#   bench/attention.sh --quick, bench/gpt.sh --quick (GPT-2's harness on a 2-layer model with 2,048 ids)
# bench/run.sh's PyTorch rows run only where torch is installed (bench/install-torch.sh); otherwise the table must say
# the twin was not run.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
build=$(dirname "$(dirname "$HPCTRAIN")")
bench=$HPCTRAIN_SOURCE_DIR/bench
export TMPDIR=$WORK

"$bench/data_pipeline.sh" --build-dir "$build" --quick >data.txt 2>&1 || { cat data.txt >&2; fail "data_pipeline.sh"; }
grep -qE "global shuffle, first epoch .* MB/s" data.txt && grep -qE "background reader .* ms .*vs memory" data.txt &&
  grep -qE "global shuffle, file as 'data generate' wrote it: epochs 2-4 .* MB/s [0-9]+%" data.txt &&
  pass "data_pipeline.sh --quick prints its table" || { cat data.txt >&2; fail "data_pipeline.sh table"; }

"$bench/augmentation.sh" --build-dir "$build" --quick >augmentation.txt 2>&1 ||
  { cat augmentation.txt >&2; fail "augmentation.sh"; }
grep -qE "volumes .* in memory +[0-9.]+/s +[0-9.]+/s" augmentation.txt &&
  grep -qE "inputs/cosmoflow-small.toml +[0-9.]+/s +[0-9.]+/s" augmentation.txt &&
  pass "augmentation.sh --quick prints its table" || { cat augmentation.txt >&2; fail "augmentation.sh table"; }

REPEATS=1 BENCH_DIR=$WORK HPCTRAIN=$HPCTRAIN "$bench/checkpoint_bandwidth.sh" 1 >checkpoint.txt 2>&1 ||
  { cat checkpoint.txt >&2; fail "checkpoint_bandwidth.sh"; }
grep -qE "^1 MB +1x[0-9]+ +new +[0-9]+" checkpoint.txt && grep -qE "^1 MB +2x[0-9]+ +new +[0-9]+" checkpoint.txt &&
  pass "checkpoint_bandwidth.sh 1 prints rows for 1 and 2 ranks" ||
  { cat checkpoint.txt >&2; fail "checkpoint_bandwidth.sh table"; }

CORES=$(nproc)  # OMP_NUM_THREADS=1 here: 1 (run.sh's 2-rank rows are left out)
if (($(env -u OMP_NUM_THREADS nproc) >= 2)); then
  "$bench/weak_scaling.sh" --build-dir "$build" --rounds 1 --steps 25 >weak.txt 2>&1 ||
    { cat weak.txt >&2; fail "weak_scaling.sh"; }
  grep -qE "^1 rank, batch 128 +[0-9]+ +[0-9.]+ ms" weak.txt &&
    grep -qE "^2 ranks, rank-order +[0-9]+ +[0-9.]+ +[0-9.]+ ms +[0-9.]+ ms" weak.txt &&
    grep -qE "^2 ranks, rank-order-replicated +[0-9]+ +[0-9.]+ +[0-9.]+ ms +[0-9.]+ ms" weak.txt &&
    grep -qE "^2 ranks, library +[0-9]+ +[0-9.]+ +[0-9.]+ ms +[0-9.]+ ms" weak.txt &&
    pass "weak_scaling.sh prints a row per all-reduce algorithm" || { cat weak.txt >&2; fail "weak_scaling.sh table"; }
fi
if [[ -x $build/bin/gemm_ceiling ]]; then
  "$bench/run.sh" --build-dir "$build" --quick >run.txt 2>&1 || { cat run.txt >&2; fail "run.sh --quick"; }
  grep -qE "^\| MLP fp32 GFLOP/s vs oneDNN matmul +\| [0-9,.]+ +\| [0-9,.]+ +\| [0-9.]+" run.txt &&
    grep -q "^| weak scaling" run.txt && pass "run.sh --quick prints its table" || { cat run.txt >&2; fail "run.sh table"; }
  grep -qE "^\| optimizer kernels fp32 \(optimizer_pass\) vs same-traffic pass +\| [0-9.]+ GB/s +\| - +\| [0-9.]+" run.txt &&
    pass "run.sh --quick prints the optimizer_pass rows" || { cat run.txt >&2; fail "run.sh optimizer_pass row"; }
  grep -qE "^\|   same, vs that pass with flushed caches +\| [0-9.]+ +\| [0-9.]+ +\| [0-9.]+" run.txt &&
    pass "run.sh --quick compares the optimizer phase with the pass from flushed caches" ||
    { cat run.txt >&2; fail "run.sh flushed-cache row"; }
  grep -qE "^\| fp32 1x[0-9]+ +\| step +\| [0-9.]+ +\| [0-9.]+ +\| [0-9.]+ +\| sum of the limits" run.txt &&
    { ((CORES < 2)) || { grep -qE "^\| fp32 2x1 b256 +\| all-reduce +\| [0-9.]+ +\| [0-9.]+ +\| [0-9.]+" run.txt &&
      grep -qE "^\| fp32 2x1 b256 +\| optimizer +\|.*\(half: each rank's slice\)" run.txt; }; } &&
    pass "run.sh --quick prints the roofline table" || { cat run.txt >&2; fail "run.sh roofline table"; }
  # run.sh takes bench/install-torch.sh's environment when it exists, else Debian's python3.
  twin_python=${HPCTRAIN_TORCH_VENV:-$bench/.venv}/bin/python
  [[ -x $twin_python ]] || twin_python=$PYTHON
  if "$twin_python" -c "import torch" 2>/dev/null; then
    grep -qE "^\| MLP bf16 samples/s vs PyTorch twin +\| [0-9,]+ +\| [0-9,]+" run.txt && pass "torch twin rows measured" ||
      fail "torch is installed but the twin rows are empty"
  else
    grep -qi "torch.*not installed\|no torch" run.txt && pass "no torch here: the table says so" ||
      fail "torch missing and the table does not say so"
  fi
  "$bench/cnn.sh" --build-dir "$build" --quick >cnn.txt 2>&1 || { cat cnn.txt >&2; fail "cnn.sh --quick"; }
  grep -qE "^cosmoflow-small +fp32 +32 +[0-9]+ .* [0-9.]+x?$|^cosmoflow-small +fp32 +32 +[0-9]+ .* [0-9.]+$" cnn.txt &&
    grep -qE "^cosmoflow-small conv2 +[0-9.]+ +[0-9.]+ +[0-9]+%" cnn.txt &&
    grep -qE "^cosmoflow-small pool1, last( +[0-9.]+x?){6}$" cnn.txt &&
    grep -qE "^cnn2d pool1, first( +[0-9.]+x?){6}$" cnn.txt && pass "cnn.sh --quick prints both tables" ||
    { cat cnn.txt >&2; fail "cnn.sh tables"; }
  "$bench/attention.sh" --build-dir "$build" --quick >attention.txt 2>&1 || { cat attention.txt >&2; fail "attention.sh --quick"; }
  grep -qE "^ +64 fp32 +forward +[0-9.]+ " attention.txt && grep -qE "^ +64 bf16 +forward\+backward +[0-9.]+ " attention.txt &&
    pass "attention.sh --quick prints its table" || { cat attention.txt >&2; fail "attention.sh table"; }
  "$bench/gpt.sh" --build-dir "$build" --quick >gpt.txt 2>&1 || { cat gpt.txt >&2; fail "gpt.sh --quick"; }
  grep -qE "^gpt2-quick +fp32 +4 x 64 \| +[0-9.]+ s +[0-9]+ \|" gpt.txt &&
    grep -qE "^gpt2-quick +bf16 +4 x 64 \| +[0-9.]+ s +[0-9]+ \|" gpt.txt &&
    grep -qE "^gpt-tiny +fp32 1t +16 x 64 \| +[0-9.]+ s +[0-9]+ \|" gpt.txt && pass "gpt.sh --quick prints its table" ||
    { cat gpt.txt >&2; fail "gpt.sh table"; }
else
  echo "not run: bench/run.sh, bench/cnn.sh, bench/attention.sh (this build has HPCTRAIN_BENCHMARKS=OFF: no gemm_ceiling,"\
    "spatial_kernels, attention_kernels)"
fi
finish
