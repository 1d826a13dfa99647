#!/bin/sh
# Build the shim's libFuzzer harness (fuzz_shim.c beside this script) into OUTPUT with clang,
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
source="$(cd "$(dirname "$0")" && pwd)/fuzz_shim.c"
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
  -o "$tmp" "$source"
mv -f "$tmp" "$output"
