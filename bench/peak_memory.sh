#!/usr/bin/env bash
# bench/peak_memory.sh: peak memory (max RSS, /usr/bin/time -v) of a CPU run of the build with the CUDA module
# against a CPU-only build (-DHPCTRAIN_CUDA=OFF), side by side: the same deck (an MLP on spirals, 60 steps, 1 rank,
# 1 thread), with run.device = "cpu" and "auto", in alternating rounds (each round runs every configuration of both
# builds, the order flipped every other round, so that load from elsewhere hits both); the figures are medians over
# the rounds. For scale, `hpctrain --version`, which opens the module in the CUDA build (what the CUDA libraries cost
# once loaded). Exits 1 when a CPU run of the CUDA build peaks more than 20 MiB above the CPU-only build's.
#
#   bench/peak_memory.sh                                   builds the release and cpu-only presets first
#   bench/peak_memory.sh --cuda-build DIR --cpu-build DIR  uses existing builds (DIR/bin/hpctrain)
#   --runs N                                               rounds (default 5)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cuda_build="" cpu_build="" runs=5 limit_mib=20
while (($#)); do
  case $1 in
    --cuda-build) cuda_build=$(cd "$2" && pwd); shift 2 ;;
    --cpu-build) cpu_build=$(cd "$2" && pwd); shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h | --help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "peak_memory.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x /usr/bin/time ]] || { echo "peak_memory.sh: needs /usr/bin/time (Debian package 'time')" >&2; exit 2; }
build_preset() { # build_preset NAME TARGETS...: configure and build a preset, print its build directory
  local preset=$1; shift
  (cd "$ROOT" && cmake --preset "$preset" >/dev/null && cmake --build --preset "$preset" -j2 --target "$@" >/dev/null)
  echo "$ROOT/build/$preset"
}
[[ -n $cuda_build ]] || cuda_build=$(build_preset release hpctrain)
[[ -n $cpu_build ]] || cpu_build=$(build_preset cpu-only hpctrain)

work=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-peak-memory.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
"$cuda_build/bin/hpctrain" data generate spirals --samples 4096 --classes 3 --noise 0.05 --seed 1 --output train.h5 \
  >/dev/null
cat >deck.toml <<'TOML'
[data]
train = "train.h5"
validation = "train.h5"
batch_size = 128
[model]
layers = [ { type = "linear", out = 128 }, { type = "relu" }, { type = "linear", out = 128 }, { type = "relu" },
  { type = "linear", out = 3 } ]
[train]
steps = 60
eval_every = 30
TOML

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
peak_mib() { # peak_mib BUILD ARGS...: max RSS in MiB of one run of BUILD/bin/hpctrain ARGS
  local build=$1; shift
  rm -rf out
  OMP_NUM_THREADS=1 /usr/bin/time -v -o time.txt "$build/bin/hpctrain" "$@" >run.log 2>&1 ||
    { cat run.log >&2; echo "peak_memory.sh: hpctrain $* failed ($build)" >&2; exit 1; }
  awk -F': ' '/Maximum resident set size/ {printf "%.1f\n", $2 / 1024}' time.txt
}

rows=(cpu auto version)
configurations=()
for row in "${rows[@]}"; do configurations+=("cuda.$row" "cpu.$row"); done
for ((round = 0; round < runs; round++)); do
  order=("${configurations[@]}")
  if ((round % 2 == 1)); then  # every other round backwards: neither build always runs first
    order=()
    for ((i = ${#configurations[@]} - 1; i >= 0; i--)); do order+=("${configurations[i]}"); done
  fi
  for configuration in "${order[@]}"; do
    dir=${configuration%%.*}_build row=${configuration#*.}
    case $row in
      version) arguments=(--version) ;;
      *) arguments=(train deck.toml --set "run.device=$row" --output out) ;;
    esac
    peak_mib "${!dir}" "${arguments[@]}" >>"$configuration.mib"
  done
done
declare -A peak
for configuration in "${configurations[@]}"; do
  peak[$configuration]=$(median <"$configuration.mib")
done
modules=$("$cuda_build/bin/hpctrain" --version | sed -n 's/^  CUDA: *//p')

echo "peak RSS (MiB), $(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores;" \
  "MLP 2-128-128-3, 60 steps, 1 rank x 1 thread, median of $runs alternating round(s)"
echo "CUDA build: $cuda_build (CUDA: $modules)"
echo "CPU build:  $cpu_build"
printf '%-34s %12s %12s %12s\n' "" "CUDA build" "CPU-only" "difference"
status=0
for row in "${rows[@]}"; do
  case $row in
    cpu) label='train, run.device = "cpu"' ;;
    auto) label='train, run.device = "auto"' ;;
    version) label='hpctrain --version (opens module)' ;;
  esac
  difference=$(awk "BEGIN { printf \"%+.1f\", ${peak[cuda.$row]} - ${peak[cpu.$row]} }")
  printf '%-34s %12s %12s %12s\n' "$label" "${peak[cuda.$row]}" "${peak[cpu.$row]}" "$difference"
  if [[ $row != version ]] && awk "BEGIN { exit !(${difference#+} > $limit_mib) }"; then
    echo "peak_memory.sh: a CPU run of the CUDA build takes $difference MiB more than the CPU-only build's" \
      "(limit $limit_mib MiB)" >&2
    status=1
  fi
done
exit $status
