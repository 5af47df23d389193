#!/usr/bin/env bash
# Checkpoint write and read bandwidth of hpctrain for models of several sizes, on 1 and 2 ranks, against a raw `dd` of
# the same number of bytes to the same disk (write: dd conv=fsync, like the checkpoint's fsync; read: dd to /dev/null).
# Medians of REPEATS runs; a dd pair runs right before each hpctrain pair, and the percentages are medians of those
# pairs' ratios (the disk's speed here drifts by 2-5x within minutes). Both reads find the file in the page cache (it
# was just written): the read rows compare hpctrain's parallel-HDF5 read (by node; docs/design.md) with a cached
# sequential read, and with a bound that fills memory as a read must (bench/state_read_ceiling: every rank reads the
# whole file into touched memory, with preads straight into it or through a cache-sized buffer and streaming stores,
# the faster of the two; "of bound" = its time over hpctrain's read time, when the benchmarks are built).
#
# HPCTRAIN_BASE=another hpctrain binary (an older build) adds its rows, measured in the same rounds, the order of the two
# alternating from round to round. HPCTRAIN_CHECKPOINT_PHASES=1 makes hpctrain print the time of each phase of each
# write and read (this script repeats those lines on stderr).
#
# Each rank runs THREADS OpenMP threads (default: the cores divided by the ranks, as a job would; a single process
# reads its checkpoint on all of them).
#
#   bench/checkpoint_bandwidth.sh [SIZES_MB...]      (default: 10 100 1000; REPEATS=3; RANKS="1 2";
#                                                     THREADS=per rank; BENCH_DIR=a directory on the disk)
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("${@:-10 100 1000}")
read -r -a sizes <<<"${sizes[*]}"
repeats=${REPEATS:-3}
hpctrain=${HPCTRAIN:-build/release/bin/hpctrain}
ceiling_program=$(dirname "$hpctrain")/state_read_ceiling  # built with the benchmarks (bench/state_read_ceiling.cpp)
[[ -x $hpctrain ]] || { cmake --preset release >/dev/null && cmake --build --preset release -j2 >/dev/null; }
mpiexec=(mpiexec --oversubscribe --bind-to none)
[[ $(id -u) -eq 0 ]] && mpiexec+=(--allow-run-as-root)
work=$(mktemp -d "${BENCH_DIR:-${TMPDIR:-/tmp}}/hpctrain-ckpt-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
binaries=("$hpctrain") labels=(new)
[[ -n ${HPCTRAIN_BASE:-} ]] && binaries+=("$HPCTRAIN_BASE") labels+=(base)
writes=() reads=() write_shares=() read_shares=()
"$hpctrain" data generate blobs --samples 64 --features 16 --classes 2 --output "$work/data.h5" >/dev/null

calc() { awk "BEGIN { printf \"%.6f\", $* }"; }
now() { date +%s.%N; }
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

printf '%s\n' "checkpoint bandwidth, $(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores," \
  "disk: $(df -h "$work" | awk 'NR==2{print $1" ("$2")"}'), median of $repeats"
printf '%-10s %-8s %-6s %12s %12s %12s %12s %8s %8s %12s %8s\n' "state" "r x thr" "binary" "write MB/s" "dd write" \
  "read MB/s" "dd read" "write %" "read %" "bound MB/s" "of bound"
for size in "${sizes[@]}"; do
  # AdamW state = parameters + 2 moments = 12 bytes per parameter; model 16 -> H -> 2 has 19 H + 2 parameters.
  hidden=$(( size * 1000000 / 12 / 19 ))
  bytes=$(( (19 * hidden + 2) * 12 ))
  cat >"$work/deck.toml" <<TOML
[data]
train = "$work/data.h5"
batch_size = 2
[model]
layers = [ { type = "linear", out = $hidden }, { type = "relu" }, { type = "linear", out = 2 } ]
[train]
steps = 1
log_every = 1
TOML
  # The resume trains one more step (a run already complete at its last step would not read its checkpoint).
  sed 's/^steps = 1$/steps = 2/' "$work/deck.toml" >"$work/resume.toml"
  for ranks in ${RANKS:-1 2}; do
    threads=${THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))}
    dd_writes=() dd_reads=()
    bounds=()
    for b in "${!binaries[@]}"; do writes[b]="" reads[b]="" write_shares[b]="" read_shares[b]="" bound_shares[b]=""; done
    for repeat in $(seq "$repeats"); do
      order=("${!binaries[@]}")
      (( repeat % 2 == 0 )) && order=($(printf '%s\n' "${order[@]}" | tac))  # alternate which binary goes first
      for b in "${order[@]}"; do
        # dd right before each binary's runs, so that each pair meets the disk in the same state.
        start=$(now)
        dd if=/dev/zero of="$work/dd.bin" bs=4M count=$(( (bytes + 4194303) / 4194304 )) conv=fsync status=none
        dd_write=$(calc "$(now) - $start")
        start=$(now)
        dd if="$work/dd.bin" of=/dev/null bs=4M status=none
        dd_read=$(calc "$(now) - $start")
        rm -f "$work/dd.bin"
        dd_writes+=("$dd_write") dd_reads+=("$dd_read")
        out="$work/run-$size-$ranks-$repeat-$b"
        OMP_NUM_THREADS=$threads "${mpiexec[@]}" -n "$ranks" "${binaries[b]}" train "$work/deck.toml" --output "$out" \
          >"$out.log" 2>&1
        write=$(sed -n 's/.*written in \([0-9.]*\) s/\1/p' "$out.log")
        OMP_NUM_THREADS=$threads "${mpiexec[@]}" -n "$ranks" "${binaries[b]}" train "$work/resume.toml" --output "$out" \
          --resume "$out/checkpoints/step-00000001.h5" >"$out.resume.log" 2>&1
        read=$(sed -n 's/.*read in \([0-9.]*\) s/\1/p' "$out/train.log")
        if [[ -x $ceiling_program ]]; then  # the same file, still cached: every rank reads all of it into memory
          bound=$(OMP_NUM_THREADS=$threads "${mpiexec[@]}" -n "$ranks" "$ceiling_program" \
            "$out/checkpoints/step-00000001.h5" --repeats 5 | sed -n 's/.*seconds=\([0-9.]*\).*/\1/p')
          bounds+=("$bound") bound_shares[b]+=" $(calc "100 * $bound / $read")"
        fi
        writes[b]+=" $write" reads[b]+=" $read"
        write_shares[b]+=" $(calc "100 * $dd_write / $write")" read_shares[b]+=" $(calc "100 * $dd_read / $read")"
        if [[ -n ${HPCTRAIN_CHECKPOINT_PHASES:-} ]]; then
          sed -n "s|^checkpoint |${size} MB, ${ranks} ranks, ${labels[b]}: |p" "$out.log" "$out.resume.log" |
            grep phases >&2 || true
        fi
        rm -rf "$out"
      done
    done
    mb=$(calc "$bytes / 1000000")
    dw=$(printf '%s\n' "${dd_writes[@]}" | median); dr=$(printf '%s\n' "${dd_reads[@]}" | median)
    for b in "${!binaries[@]}"; do
      w=$(printf '%s\n' ${writes[b]} | median); r=$(printf '%s\n' ${reads[b]} | median)
      bound_columns=("-" "-")
      if ((${#bounds[@]})); then
        bound_columns=("$(printf '%.0f' "$(calc "$mb / $(printf '%s\n' "${bounds[@]}" | median)")")"
          "$(printf '%.0f%%' "$(printf '%s\n' ${bound_shares[b]} | median)")")
      fi
      printf '%-10s %-8s %-6s %12.0f %12.0f %12.0f %12.0f %7.0f%% %7.0f%% %12s %8s\n' "${size} MB" "${ranks}x$threads" \
        "${labels[b]}" "$(calc "$mb / $w")" "$(calc "$mb / $dw")" "$(calc "$mb / $r")" "$(calc "$mb / $dr")" \
        "$(printf '%s\n' ${write_shares[b]} | median)" "$(printf '%s\n' ${read_shares[b]} | median)" "${bound_columns[@]}"
    done
  done
done
echo "goals: checkpoint write >= 70% of dd (conv=fsync), read >= 50% of a cached dd read"
echo "bound: state_read_ceiling, every rank reading the whole cached checkpoint into touched memory, the faster of"
echo "  preads straight into it and preads through a cache-sized buffer with streaming stores (the least a read"
echo "  of replicated state does; dd's buffer stays in cache); 'of bound' = its time over hpctrain's read time"
