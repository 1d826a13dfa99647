#!/bin/sh
# Build the shim's libFuzzer harness (fuzz_shim.c beside this script, linked with every .c file of
# the shim, cni/shim/*.c, with the shim's main renamed) into OUTPUT with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer (any UB report aborts, so the fuzzer counts it
# as a crash). Needs clang and its compiler-rt (Debian: apt-get install clang libclang-rt-dev;
# scripts/setup.sh does). FUZZ_CC=... picks another clang.
#
#     cni/shim/fuzz/build.sh build/shim-fuzz/fuzz_shim
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTPUT" >&2
  exit 2
fi
output=$1
here="$(cd "$(dirname "$0")" && pwd)"
cc=${FUZZ_CC:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "fuzz/build.sh: no $cc: apt-get install clang libclang-rt-dev" >&2
  exit 1
fi

mkdir -p "$(dirname "$output")"
tmp="$output.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"$cc" -std=c11 -g -O1 -Wall -Wextra -Werror -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Dmain=netagent_shim_main -o "$tmp" "$here/fuzz_shim.c" "$here"/../*.c
mv -f "$tmp" "$output"
