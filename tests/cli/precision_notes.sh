#!/usr/bin/env bash
# The log's precision note: a 16-bit run on a CPU that computes it through fp32 says so once, at the start (fp16
# always on the CPU backend; bf16 where oneDNN has no bf16 kernel, forced here with HPCTRAIN_ONEDNN_BF16=0); fp32 and
# natively run bf16 print none. Training is not what is tested: 2 steps each.
source "$(dirname "$0")/lib/common.bash"
cd "$WORK"
make_spirals train.h5 256 1
tiny_mlp_deck deck.toml
note_lines() { grep -c "^precision $1: .*fp32" "$2" || true; }
for mode in fp32 bf16 fp16; do
  run_ranks 2 train deck.toml --output run-$mode --set precision.mode=$mode >$mode.log 2>&1 ||
    { cat $mode.log >&2; fail "$mode run failed"; }
done
HPCTRAIN_ONEDNN_BF16=0 run_ranks 2 train deck.toml --output run-widened --set precision.mode=bf16 >widened.log 2>&1 ||
  { cat widened.log >&2; fail "bf16 run with HPCTRAIN_ONEDNN_BF16=0 failed"; }

[[ $(grep -c "^precision " fp32.log) -eq 0 ]] && pass "fp32: no note" || fail "fp32 printed a precision note"
[[ $(note_lines fp16 fp16.log) -eq 1 ]] && pass "fp16: one note" || { cat fp16.log >&2; fail "fp16: no single note"; }
grep -q "^precision fp16: .*slower than fp32" fp16.log && pass "fp16: the note says why" ||
  fail "fp16: the note does not say it is slower"
[[ $(note_lines bf16 widened.log) -eq 1 ]] && pass "bf16 widened: one note" ||
  { cat widened.log >&2; fail "bf16 with HPCTRAIN_ONEDNN_BF16=0: no single note"; }
grep -q "^precision bf16: .*no faster than fp32" widened.log && pass "bf16 widened: the note says why" ||
  fail "bf16 widened: the note does not say it is no faster"
# Natively run bf16 (oneDNN's bf16 kernel exists from AVX-512 on) prints none; without AVX-512 the note is expected.
if grep -qw avx512f /proc/cpuinfo; then expected=0; else expected=1; fi
[[ $(note_lines bf16 bf16.log) -eq $expected ]] && pass "bf16 on this CPU: $expected note(s)" ||
  { cat bf16.log >&2; fail "bf16 on this CPU: expected $expected note(s)"; }
finish
