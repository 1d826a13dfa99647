#!/bin/sh
# Fuzz the shim's request parsing and framing for SECONDS (default 60) with libFuzzer:
#
#     cni/shim/fuzz/run.sh [SECONDS] [WORKDIR]
#
# Builds the harness (build.sh) into WORKDIR (default build/shim-fuzz, ignored by git), starts
# from a copy of the committed seeds (corpus/) so new inputs never land in the repository by
# accident, and prints libFuzzer's figures (executions, cov, ft) at the end. A crash, a sanitizer
# report or a broken harness invariant stops it with a non-zero status and leaves the input as
# WORKDIR/crash-* (or leak-*, timeout-*): fix the shim and commit that input under corpus/.
set -eu

here="$(cd "$(dirname "$0")" && pwd)"
seconds=${1:-60}
workdir=${2:-"$here/../../../build/shim-fuzz"}
case $seconds in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS] [WORKDIR]" >&2; exit 2 ;;
esac

mkdir -p "$workdir/corpus"
sh "$here/build.sh" "$workdir/fuzz_shim"
cp "$here"/corpus/* "$workdir/corpus/"
# -max_len: room for nesting past the 512 levels the shim allows; -timeout: one input's bound.
exec "$workdir/fuzz_shim" -max_total_time="$seconds" -max_len=8192 -timeout=20 -rss_limit_mb=2048 \
  -dict="$here/shim.dict" -artifact_prefix="$workdir/" -print_final_stats=1 \
  "$workdir/corpus"
