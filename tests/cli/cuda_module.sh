#!/usr/bin/env bash
# One executable for CPU and GPU nodes: hpctrain links no CUDA library and opens the CUDA module
# (libhpctrain_cuda.so, in lib/ beside its bin/) only for run.device = "cuda", or "auto" where the driver is installed,
# so a CPU deck runs where the CUDA libraries are absent.
# - readelf: no CUDA library among the executable's NEEDED entries; LD_DEBUG: a CPU run loads none either;
# - a copy of the build's layout (bin/hpctrain, lib/libhpctrain_cuda.so without its build RUNPATH) run through the
#   dynamic loader with --inhibit-cache (/etc/ld.so.cache is what finds the CUDA libraries here), so the module's
#   libraries cannot be found: a CPU deck trains on 2 ranks; "auto" trains on the CPU and says why in one log line;
#   "cuda" stops every rank with one message naming the module's path and the missing library (exit 2, nothing
#   written); `hpctrain --version` says the module is unusable and why;
# - the module moved away (a copy of bin/ without lib/): the same, naming the missing module;
# - the module as built and as installed (`cmake --install`) opens: "cuda" either trains (a GPU here) or says that no
#   rank sees a device, and --version names the module's path.
# In a build without the module only the first checks and the "cuda"/"auto" outcomes apply.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 512 1
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
batch_size = 64
[model]
layers = [ { type = "linear", out = 16 }, { type = "relu" }, { type = "linear", out = 3 } ]
[train]
steps = 4
TOML

cuda_libraries='lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|nvJitLink)\.so'
needed=$(readelf -d "$HPCTRAIN" | grep NEEDED || true)
if grep -qE "$cuda_libraries" <<<"$needed"; then
  fail "the executable links CUDA libraries: $(grep -oE "\[$cuda_libraries[^]]*\]" <<<"$needed" | tr '\n' ' ')"
else
  pass "no CUDA library among the executable's $(grep -c NEEDED <<<"$needed") NEEDED entries"
fi
# The loader's own account of a CPU run (1 rank): no library of the module is loaded. (The driver, libcuda.so.1, is
# left out: the warning about idle GPUs asks it for the device count, where it is installed.)
module_libraries='lib(cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|nvJitLink|hpctrain_cuda)\.so'
LD_DEBUG=files run_ranks 1 train deck.toml --output ld-debug >ld-debug.log 2>&1 ||
  { cat ld-debug.log >&2; fail "CPU run under LD_DEBUG"; }
grep -qE "calling init: .*/libmpi\.so" ld-debug.log || fail "LD_DEBUG=files printed no library loads (cannot check)"
if grep -qE "calling init: .*$module_libraries" ld-debug.log; then
  fail "a CPU run loaded CUDA libraries: $(grep -oE "calling init: .*$module_libraries.*" ld-debug.log | sort -u)"
else
  pass "a CPU run loads no CUDA library ($(grep -c 'calling init:' ld-debug.log) libraries initialised)"
fi

# auto_falls_back NAME: trains on the CPU, and train.log's head says why in one line
auto_falls_back() {
  if run_ranks 2 train deck.toml --set run.device=auto --output "$1" >"$1.log" 2>&1 &&
    grep -q "backend cpu" "$1/train.log" &&
    (($(grep -c '^run.device = "auto": training on the CPU (' "$1/train.log") == 1)); then
    pass "$1: auto trains on the CPU: $(grep '^run.device = "auto"' "$1/train.log")"
  else
    cat "$1.log" >&2; fail "$1: run.device = auto"
  fi
}

module=${HPCTRAIN_BUILT_CUDA_MODULE:-}
if [[ -z $module ]]; then
  expect_error cpu-only-build "this build has no CUDA backend" 2 train deck.toml --set run.device=cuda --output cuda
  auto_falls_back cpu-only-auto
  "$HPCTRAIN" --version | grep -qE '^  CUDA: +off$' && pass "--version: CUDA off" || fail "--version: $("$HPCTRAIN" --version)"
  finish
  exit
fi
[[ $module == "$(dirname "$(dirname "$HPCTRAIN")")/lib/libhpctrain_cuda.so" ]] ||
  fail "the module $module is not in lib/ beside $(dirname "$HPCTRAIN")"

# opens NAME: run.device = cuda with the module as found from $HPCTRAIN: it opens (its calls back into the executable
# resolve), then finds a device or not; --version names the module.
opens() {
  if run_ranks 2 train deck.toml --set run.device=cuda --output "$1-gpu" >"$1-gpu.log" 2>&1; then
    pass "$1: run.device = cuda trained (this machine has a GPU)"
  else
    expect_error "$1" "run.device = \"cuda\" but no rank sees a CUDA device" 2 train deck.toml --set run.device=cuda \
      --output "$1-gpu"
  fi
  local version
  version=$("$HPCTRAIN" --version | sed -n 's/^  CUDA: *//p')
  [[ $version == "module $2 ("*"cuBLASLt"*"), "[0-9]*" device(s) visible" ]] && pass "$1: --version: $version" ||
    fail "$1: --version says '$version', not the module $2"
}
opens built "$module"

# A copy of the build's layout whose module cannot find its CUDA libraries: the loader runs without its cache, and the
# copy of the module has no RUNPATH (the build's one points at the toolkit).
build=$(dirname "$(dirname "$HPCTRAIN")")
loader=$(readelf -l "$HPCTRAIN" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
mkdir -p hidden/bin hidden/lib
cp "$HPCTRAIN" hidden/bin/hpctrain
cp "$module" hidden/lib/libhpctrain_cuda.so
printf 'file(RPATH_REMOVE FILE "%s")\n' "$WORK/hidden/lib/libhpctrain_cuda.so" >strip.cmake
cmake -P strip.cmake >/dev/null
if "$loader" --inhibit-cache --list "$WORK/hidden/lib/libhpctrain_cuda.so" >hidden.txt 2>&1 ||
  ! grep -qE "$cuda_libraries[.0-9]* => not found|$cuda_libraries[.0-9]*: cannot open" hidden.txt; then
  echo "skipped: the CUDA libraries are in the loader's default folders here, they cannot be hidden"
else
  printf '#!/usr/bin/env bash\nexec %q --inhibit-cache %q "$@"\n' "$loader" "$WORK/hidden/bin/hpctrain" >hidden-hpctrain
  chmod +x hidden-hpctrain
  HPCTRAIN=$WORK/hidden-hpctrain
  run_ranks 2 train deck.toml --output hidden-cpu >hidden-cpu.log 2>&1 && grep -q "backend cpu" hidden-cpu/train.log &&
    pass "CUDA libraries hidden: a CPU deck trains on 2 ranks" || { cat hidden-cpu.log >&2; fail "hidden: CPU deck"; }
  auto_falls_back hidden-auto
  expect_error hidden-cuda \
    "the CUDA backend cannot be loaded \(.*hidden/lib/libhpctrain_cuda\.so: $cuda_libraries[.0-9]*: cannot open" \
    2 train deck.toml --set run.device=cuda --output hidden-cuda
  [[ ! -e hidden-cuda ]] && pass "hidden-cuda: nothing written" || fail "hidden-cuda: wrote $(ls hidden-cuda)"
  version=$("$HPCTRAIN" --version | sed -n 's/^  CUDA: *//p')
  [[ $version == "unusable: "*"hidden/lib/libhpctrain_cuda.so: lib"*"cannot open shared object file"* ]] &&
    pass "hidden: --version: $version" || fail "hidden: --version says '$version'"
fi

# The module moved away (bin/ copied without lib/): CPU decks still run; "cuda" names the missing module.
mkdir -p moved/bin
cp "$module" moved/libhpctrain_cuda.so
cp "$build/bin/hpctrain" moved/bin/hpctrain
HPCTRAIN=$WORK/moved/bin/hpctrain
auto_falls_back moved-auto
expect_error moved-cuda "the CUDA backend cannot be loaded \(.*moved/lib/libhpctrain_cuda\.so is missing" 2 train \
  deck.toml --set run.device=cuda --output moved-cuda
# HPCTRAIN_CUDA_MODULE points it at a module elsewhere.
HPCTRAIN_CUDA_MODULE=$WORK/moved/libhpctrain_cuda.so opens moved-env "$WORK/moved/libhpctrain_cuda.so"

# Installed (cmake --install): the module under PREFIX/lib, found from PREFIX/bin/hpctrain.
if cmake --install "$build" --prefix "$WORK/prefix" >install.log 2>&1; then
  HPCTRAIN=$WORK/prefix/bin/hpctrain
  opens installed "$WORK/prefix/lib/libhpctrain_cuda.so"
else
  cat install.log >&2; fail "cmake --install $build"
fi
finish
