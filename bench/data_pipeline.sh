#!/usr/bin/env bash
# bench/data_pipeline.sh: does the data pipeline keep the trainer fed? (issue 5). Not a test: it prints measurements.
#
#   bench/data_pipeline.sh --build-dir build             use build/bin/hpctrain
#   bench/data_pipeline.sh --build-dir build --quick     small file, one run each: checks the harness, measures nothing
#   bench/data_pipeline.sh --build-dir build --baseline /work/main/build/release --reads-only
#                                                         the reads of two builds side by side, runs alternating
#
# What it measures, on one synthetic file (blobs, N samples x F float32 features, written by 'hpctrain data generate'):
#   1. Raw sequential read of the file: dd bs=4M to /dev/null, as one stream, and as R concurrent streams that each
#      read a 1/R stripe (the same concurrency as R ranks; their per-stream rate is the like-for-like anchor of a
#      per-rank figure, since R readers share the memory bandwidth one stream has alone). The page cache is warm, as
#      a job finds a data set it has read from storage once: the file is written back, its pages dropped (its own,
#      no root needed) and read once before timing, so every figure here is "from memory through the kernel". The
#      global shuffle is also measured on a copy made with cp and on the file as 'data generate' leaves it (the page
#      cache's folios differ: see below).
#   2. Per-rank read throughput of the loader on R ranks ('hpctrain data bench', data.prefetch = 0 so the reading is
#      timed, not hidden): bytes of batches delivered per second and rank, median over the ranks, for a global shuffle
#      (random rows: the first epoch, which also builds each rank's page tables of the file's map, and epochs 2-4 of a
#      4-epoch run, as the bare copy's figures), the file order, and the local shuffle (its one-off staging
#      read of the rank's slice, then batches from memory). Also HDF5's own read path (HPCTRAIN_HDF5_DIRECT=0) for
#      comparison, and the same bytes as 16 KiB image rows in a file with page-aligned chunks (h5repack -a 4096).
#      Goal: >= 80% of the raw read.
#   3. Step time of 'hpctrain train' on R ranks x 1 thread with data read from the file by the background reader
#      (data.prefetch = 2) against the same steps with the data already in memory (data.in_memory = true), and with
#      synchronous reads (data.prefetch = 0) for scale: median step time over the steps after a warm-up. Goal: HDF5
#      within 5% of memory. Also on 1 rank x 1 thread: with R ranks on R cores the reader thread has no core of its
#      own and competes with the compute, while a rank on a cluster node usually has spare cores; 1 rank on this
#      machine shows that case.
# Every figure is the median over --runs repetitions (the runs of the configurations alternate, so load from elsewhere
# hits them alike). A share of dd is the median over the runs of the figure's ratio to a round of the R concurrent
# dd streams run right before it: rates here drift by 20-40% between minutes, so a figure set against dd measured
# minutes earlier could be off by as much. With --baseline DIR every loader figure (2 and 3) is also measured with DIR/bin/hpctrain, each of its
# runs right before the same run of the build under test, and reported next to it with the ratio (this build / baseline).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR="$ROOT/build"
RANKS=2
SAMPLES=200000
FEATURES=256
RUNS=5
STEPS=300
WARMUP=20
KEEP=0
BASELINE_DIR=
READS_ONLY=0

usage() {
  sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  cat <<EOF

options:
  --build-dir DIR  the build whose bin/hpctrain to run (default: build)
  --ranks R        ranks of the multi-rank measurements (default $RANKS)
  --samples N      samples in the file (default $SAMPLES)
  --features F     float32 features per sample (default $FEATURES: $((SAMPLES * FEATURES * 4 / 1000000)) MB)
  --runs K         repetitions of each measurement (default $RUNS)
  --baseline DIR   also run DIR/bin/hpctrain, alternating with the build under test, and report both side by side
  --reads-only     sections 1 and 2 only (no training step times)
  --steps S        training steps per run (default $STEPS; the first $WARMUP are warm-up)
  --quick          20000 samples, 1 run, 60 steps
  --keep           keep the temporary directory
EOF
}

while (($#)); do
  case $1 in
    --build-dir) BUILD_DIR=$(cd "$2" && pwd); shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --features) FEATURES=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --quick) SAMPLES=20000; RUNS=1; STEPS=60; shift ;;
    --keep) KEEP=1; shift ;;
    --baseline) BASELINE_DIR=$(cd "$2" && pwd); shift 2 ;;
    --reads-only) READS_ONLY=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

HPCTRAIN="$BUILD_DIR/bin/hpctrain"
[[ -x $HPCTRAIN ]] || { echo "no hpctrain at $HPCTRAIN: build first, or pass --build-dir" >&2; exit 2; }
BUILDS=(test)  # the builds measured, in the order their runs alternate: the baseline's run first
declare -A BINARY=([test]=$HPCTRAIN)
if [[ -n $BASELINE_DIR ]]; then
  BINARY[baseline]=$BASELINE_DIR/bin/hpctrain
  [[ -x ${BINARY[baseline]} ]] || { echo "no hpctrain at ${BINARY[baseline]}: build the baseline first" >&2; exit 2; }
  BUILDS=(baseline test)
fi
MPIEXEC=(mpiexec --oversubscribe)
[[ $(id -u) -eq 0 ]] && MPIEXEC+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hpctrain-data-bench.XXXXXX")
if ((KEEP)); then echo "keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
cd "$WORK"

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
percent() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f%%", 100 * a / b}'; }

# --- data and decks ---
"$HPCTRAIN" data generate blobs --samples "$SAMPLES" --features "$FEATURES" --classes 10 --noise 100 --seed 1 \
  --output data.h5 >/dev/null
BYTES=$(stat -c %s data.h5)
cat >deck.toml <<TOML
[run]
seed = 1
[data]
train = "data.h5"
batch_size = 256
[model]
layers = [ { type = "linear", out = 512 }, { type = "relu" }, { type = "linear", out = 10 } ]
[optimizer]
lr = 0.0001
[train]
steps = $STEPS
log_every = 1
TOML
EPOCH_STEPS=$(( (SAMPLES / RANKS + 256 / RANKS - 1) / (256 / RANKS) ))
# The same number of bytes as 16 KiB image rows (4 x 32 x 32 float32) in a file whose chunks start on 4 KiB
# boundaries, as HDF5 lays out files written with H5Pset_alignment (common on parallel file systems) or paged
# aggregation: copies of whole pages whose source is page-aligned, the case where memcpy's `rep movsb` crawls on some
# CPUs (core/copy_bytes.hpp).
IMAGE_SAMPLES=$((BYTES / 16384))
"$HPCTRAIN" data generate images --samples "$IMAGE_SAMPLES" --size 32 --channels 4 --classes 8 --seed 1 \
  --output images-packed.h5 >/dev/null
h5repack -t 1 -a 4096 images-packed.h5 images.h5
sed -e 's/"data.h5"/"images.h5"/' -e 's/{ type = "linear", out = 512 }/{ type = "flatten" }/' deck.toml >images.toml
IMAGE_EPOCH_STEPS=$(( (IMAGE_SAMPLES / RANKS + 256 / RANKS - 1) / (256 / RANKS) ))

# The page cache as a job finds a data set it reads from storage: the files' pages written back, dropped (dd's nocache
# flag; no root needed) and read once. How the pages got into the cache matters to random rows: on kernels whose file
# system caches large folios (ext4 from Linux 6.16, xfs) a read fills the cache with folios of up to 2 MiB, which the
# kernel maps with one page-table entry each (a map 2 MiB-aligned, as Linux 6.7+ places large maps), while a file just
# written on this node sits in folios no larger than its writes' pieces and their alignment allow. A copy made with cp
# has small ones: 4 KiB entries, a TLB miss per random row ("copied with cp"). hpctrain's writers write whole 2 MiB
# pieces at 2 MiB offsets (io/hdf5.hpp): the file as `data generate` leaves it is measured too ("as generated").
as_read_from_storage() { sync "$1"; dd if="$1" iflag=nocache count=0 status=none; cat "$1" >/dev/null; }
cp --reflink=never data.h5 written.h5  # a copy of the bytes, never shared extents (xfs, btrfs)
sed -e 's/"data.h5"/"written.h5"/' deck.toml >written.toml
as_read_from_storage data.h5
as_read_from_storage images.h5
"$HPCTRAIN" data generate blobs --samples "$SAMPLES" --features "$FEATURES" --classes 10 --noise 100 --seed 1 \
  --output generated.h5 >/dev/null
sed -e 's/"data.h5"/"generated.h5"/' deck.toml >generated.toml

# --- 1. raw sequential read ---
raw=()
for ((run = 0; run < RUNS; ++run)); do
  # Five passes timed together: one pass of a cached file takes a few tens of milliseconds.
  start=$(date +%s.%N)
  for pass in 1 2 3 4 5; do dd if=data.h5 of=/dev/null bs=4M status=none; done
  end=$(date +%s.%N)
  raw+=("$(awk -v b="$BYTES" -v s="$start" -v e="$end" 'BEGIN {printf "%.1f", 5 * b / (e - s) / 1e6}')")
done
RAW=$(printf '%s\n' "${raw[@]}" | median)
# R concurrent streams over stripes of the file: per-stream MB/s, median over streams, then over runs. Every figure
# below is also set against a round of these streams run right before it (its share of dd: the median over runs of the
# per-run ratios), since this machine's rates drift by 20-40% between minutes.
STRIPE_BLOCKS=$(( (BYTES + RANKS * 4194304 - 1) / (RANKS * 4194304) ))
dd_round() {  # prints one round's median per-stream MB/s of RANKS concurrent streams
  local rates=() stream
  for ((stream = 0; stream < RANKS; ++stream)); do
    (start=$(date +%s.%N)
     for pass in 1 2 3 4 5; do
       dd if=data.h5 of=/dev/null bs=4M skip=$((stream * STRIPE_BLOCKS)) count="$STRIPE_BLOCKS" status=none
     done
     end=$(date +%s.%N)
     stripe=$(( BYTES - stream * STRIPE_BLOCKS * 4194304 ))
     ((stripe > STRIPE_BLOCKS * 4194304)) && stripe=$((STRIPE_BLOCKS * 4194304))
     awk -v b="$stripe" -v s="$start" -v e="$end" 'BEGIN {printf "%.1f\n", 5 * b / (e - s) / 1e6}' >"stream-$stream") &
  done
  wait
  for ((stream = 0; stream < RANKS; ++stream)); do rates+=("$(cat "stream-$stream")"); done
  printf '%s\n' "${rates[@]}" | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.4f", a / b}'; }
striped=()
for ((run = 0; run < RUNS; ++run)); do striped+=("$(dd_round)"); done
STRIPED=$(printf '%s\n' "${striped[@]}" | median)
# The bare copy of random rows (bench/row_copy_ceiling.cpp) on R ranks: the most a global shuffle can deliver here.
declare -A CEILING  # CEILING[file-first], CEILING[file-later]: medians over runs, MB/s per rank
declare -A SHARE    # SHARE[name]: median over runs of (figure / the dd round right before it)
ceiling() {  # ceiling FILE
  local first=() later=() first_share=() later_share=() line run dd
  CEILING[$1-first]=nan CEILING[$1-later]=nan SHARE[$1-first]=nan SHARE[$1-later]=nan
  [[ -x $BUILD_DIR/bin/row_copy_ceiling ]] || return 0
  for ((run = 0; run < RUNS; ++run)); do
    dd=$(dd_round)
    line=$("${MPIEXEC[@]}" -n "$RANKS" "$BUILD_DIR/bin/row_copy_ceiling" "$1" --row-bytes $((FEATURES * 4)) --epochs 4)
    first+=("$(sed -n 's/.*first_epoch_mbps=\([0-9.]*\).*/\1/p' <<<"$line")")
    later+=("$(sed -n 's/.*later_epochs_mbps=\([0-9.]*\).*/\1/p' <<<"$line")")
    first_share+=("$(ratio "${first[-1]}" "$dd")") later_share+=("$(ratio "${later[-1]}" "$dd")")
  done
  CEILING[$1-first]=$(printf '%s\n' "${first[@]}" | median)
  CEILING[$1-later]=$(printf '%s\n' "${later[@]}" | median)
  SHARE[$1-first]=$(printf '%s\n' "${first_share[@]}" | median)
  SHARE[$1-later]=$(printf '%s\n' "${later_share[@]}" | median)
}
ceiling data.h5
ceiling written.h5
ceiling generated.h5

# --- 2. per-rank read throughput ---
declare -A READS  # READS[build-name]: the median over runs of one 'data bench' figure
bench() {  # bench NAME FIELD ARGS...: runs 'data bench' --runs times per build (alternating), FIELD "read" or "staging"
  local name=$1 field=$2 build dd value; shift 2
  declare -A values=() shares=()
  for ((run = 0; run < RUNS; ++run)); do
    dd=$(dd_round)
    for build in "${BUILDS[@]}"; do
      value=$("${MPIEXEC[@]}" -n "$RANKS" "${BINARY[$build]}" data bench "${BENCH_DECK:-deck.toml}" \
        --set data.prefetch=0 "$@" \
        | awk -v f="$field" '$0 ~ "median per-rank " f " throughput" {print $(NF - 1)}')
      values[$build]+="$value " shares[$build]+="$(ratio "$value" "$dd") "
    done
  done
  for build in "${BUILDS[@]}"; do
    READS[$build-$name]=$(printf '%s\n' ${values[$build]} | median)
    SHARE[$build-$name]=$(printf '%s\n' ${shares[$build]} | median)
  done
}
bench global-first read --steps "$EPOCH_STEPS"
bench global-later later-epochs --steps $((4 * EPOCH_STEPS))
BENCH_DECK=written.toml bench written-first read --steps "$EPOCH_STEPS"
BENCH_DECK=written.toml bench written-later later-epochs --steps $((4 * EPOCH_STEPS))
BENCH_DECK=generated.toml bench generated-first read --steps "$EPOCH_STEPS"
BENCH_DECK=generated.toml bench generated-later later-epochs --steps $((4 * EPOCH_STEPS))
bench ordered read --set data.shuffle=false
bench local-staging staging --set data.shuffle=local --steps 1
bench local-batches read --set data.shuffle=local
HPCTRAIN_HDF5_DIRECT=0 bench hdf5-own read --steps $((EPOCH_STEPS / 10 + 1))
BENCH_DECK=images.toml bench aligned-global read --steps "$IMAGE_EPOCH_STEPS"
BENCH_DECK=images.toml bench aligned-ordered read --set data.shuffle=false

# --- 3. step time: from HDF5 with prefetch, from memory, from HDF5 without prefetch ---
step_time() {  # median step time in ms of one run's log lines after the warm-up
  awk -v warmup="$WARMUP" '$1 == "step" {split($2, s, "/"); if (s[1] > warmup) for (i = 1; i <= NF; ++i)
    if ($(i) == "samples/s") print 256 / $(i - 1) * 1000}' "$1" | median
}
declare -A times
for ((run = 0; run < RUNS && !READS_ONLY; ++run)); do
  for ranks in "$RANKS" 1; do
    for variant in prefetch memory synchronous; do
      case $variant in
        prefetch) sets=(--set data.prefetch=2) ;;
        memory) sets=(--set data.in_memory=true) ;;
        synchronous) sets=(--set data.prefetch=0) ;;
      esac
      for build in "${BUILDS[@]}"; do
        name=run-$build-$ranks-$variant-$run
        "${MPIEXEC[@]}" -n "$ranks" "${BINARY[$build]}" train deck.toml --output "$name" "${sets[@]}" \
          >"$name.log" 2>&1 || { cat "$name.log" >&2; exit 1; }
        times[$build-$ranks-$variant]+="$(step_time "$name.log") "
      done
    done
  done
done

# --- report ---
row() { printf '  %-58s %10s %s\n' "$@"; }
share() { awk -v r="${SHARE[$1]}" 'BEGIN {printf "%.0f%%", 100 * r}'; }  # a figure's median share of its dd rounds
share_of() { awk -v a="${SHARE[$1]}" -v b="${SHARE[$2]}" 'BEGIN {printf "%.0f%%", 100 * a / b}'; }  # A's vs B's
versus() {  # versus VALUE BASELINE-VALUE: "(baseline X, 1.23x)" when a baseline was measured
  [[ -n $BASELINE_DIR ]] || return 0
  awk -v a="$1" -v b="$2" -v u="$3" 'BEGIN {printf "(baseline %s%s: %.2fx)", b, u, (u == " ms" ? b / a : a / b)}'
}
echo "hpctrain data pipeline benchmark: $SAMPLES samples x $FEATURES float32 ($((BYTES / 1000000)) MB), $RANKS ranks," \
  "median of $RUNS runs; page cache warm (the files read once from storage)"
[[ -n $BASELINE_DIR ]] && echo "build under test: $HPCTRAIN; baseline: ${BINARY[baseline]} (runs alternate; ratios" \
  "are speed-ups of the build under test)"
echo "raw sequential read (dd bs=4M to /dev/null):"
row "one stream" "$RAW MB/s"
row "$RANKS concurrent streams, one stripe each (per stream)" "$STRIPED MB/s"
echo "bare copy of random rows (row_copy_ceiling: memcpy + prefetch, no loader), $RANKS ranks, per rank, vs the dd" \
  "streams measured right before each run (median of the runs' ratios):"
row "first epoch (builds each rank's page tables of the map)" "${CEILING[data.h5-first]} MB/s" \
  "$(share data.h5-first)"
row "later epochs" "${CEILING[data.h5-later]} MB/s" "$(share data.h5-later)"
row "file copied with cp: first epoch" "${CEILING[written.h5-first]} MB/s" \
  "$(share written.h5-first)"
row "file copied with cp: later epochs" "${CEILING[written.h5-later]} MB/s" \
  "$(share written.h5-later)"
row "file as 'data generate' wrote it: first epoch" "${CEILING[generated.h5-first]} MB/s" \
  "$(share generated.h5-first)"
row "file as 'data generate' wrote it: later epochs" "${CEILING[generated.h5-later]} MB/s" \
  "$(share generated.h5-later)"
echo "per-rank read throughput ('hpctrain data bench', data.prefetch = 0, median over ranks), vs $RANKS concurrent" \
  "streams measured right before each run (median of the runs' ratios; goal >= 80%) and vs one stream:"
reads() {  # reads NAME LABEL
  local value=${READS[test-$1]}
  row "$2" "$value MB/s" "$(share "test-$1") $(percent "$value" "$RAW") $(versus "$value" "${READS[baseline-$1]:-}" " MB/s")"
}
reads global-first "global shuffle, first epoch (random rows; maps the file)"
reads global-later "global shuffle, epochs 2-4 (page tables built)"
row "  vs the bare copy (first epoch; later epochs; shares of dd)" "" \
  "$(share_of test-global-first data.h5-first) $(share_of test-global-later data.h5-later)"
reads written-first "global shuffle, file copied with cp: first epoch"
reads written-later "global shuffle, file copied with cp: epochs 2-4"
row "  vs the bare copy (first epoch; later epochs; shares of dd)" "" \
  "$(share_of test-written-first written.h5-first) $(share_of test-written-later written.h5-later)"
reads generated-first "global shuffle, file as 'data generate' wrote it: first epoch"
reads generated-later "global shuffle, file as 'data generate' wrote it: epochs 2-4"
row "  vs the bare copy (first epoch; later epochs; shares of dd)" "" \
  "$(share_of test-generated-first generated.h5-first) $(share_of test-generated-later generated.h5-later)"
reads ordered "file order (data.shuffle = false)"
reads local-staging "local shuffle: staging the rank's slice (one-off)"
reads local-batches "local shuffle: batches from memory"
reads hdf5-own "global shuffle through HDF5's own reads (HPCTRAIN_HDF5_DIRECT=0)"
reads aligned-global "16 KiB rows, page-aligned chunks: global shuffle, 1st epoch"
reads aligned-ordered "16 KiB rows, page-aligned chunks: file order"
((READS_ONLY)) && exit 0
for ranks in "$RANKS" 1; do
  declare -A step=()
  for build in "${BUILDS[@]}"; do
    for variant in prefetch memory synchronous; do
      step[$build-$variant]=$(printf '%s\n' ${times[$build-$ranks-$variant]} | median)
    done
  done
  memory=${step[test-memory]} prefetch=${step[test-prefetch]} synchronous=${step[test-synchronous]}
  echo "step time (global batch 256, MLP $FEATURES-512-10, $ranks rank(s) x 1 thread, median of steps" \
    "$((WARMUP + 1))..$STEPS):"
  row "data in memory (data.in_memory = true)" "$memory ms" "$(versus "$memory" "${step[baseline-memory]:-}" " ms")"
  row "data from HDF5, background reader (data.prefetch = 2)" "$prefetch ms" \
    "$(awk -v a="$prefetch" -v b="$memory" 'BEGIN {printf "%+.1f%% vs memory (goal: within 5%%)", 100 * (a / b - 1)}') $(versus "$prefetch" "${step[baseline-prefetch]:-}" " ms")"
  row "data from HDF5, synchronous (data.prefetch = 0)" "$synchronous ms" \
    "$(awk -v a="$synchronous" -v b="$memory" 'BEGIN {printf "%+.1f%% vs memory", 100 * (a / b - 1)}') $(versus "$synchronous" "${step[baseline-synchronous]:-}" " ms")"
done
