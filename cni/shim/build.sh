#!/bin/sh
# Build the CNI shim (every .c file beside this script, compiled together; main is in
# netagent-shim.c) into OUTPUT as a static binary:
# musl-gcc -static -Os -s (about 60 KB, no loader, no libc on the host needed), or, with a
# warning, gcc -static when musl-gcc is missing (Debian: apt-get install musl-tools).
# CC=... picks a compiler explicitly. NETAGENT_DEFAULT_SOCKET=/abs/path changes the socket the shim
# uses when a config names no agentSocket (default: /run/netagent/cni.sock, `netagent run`'s):
# tests point it at their own agent. The binary is written beside OUTPUT and renamed into
# place, so a runtime executing OUTPUT never sees half a file and parallel builds do not clash.
#
#     cni/shim/build.sh build/cni-shim/netagent
set -eu

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTPUT" >&2
  exit 2
fi
output=$1
here="$(cd "$(dirname "$0")" && pwd)"

if [ -n "${CC:-}" ]; then
  cc=$CC
elif command -v musl-gcc >/dev/null 2>&1; then
  cc=musl-gcc
elif command -v gcc >/dev/null 2>&1; then
  cc=gcc
  echo "build.sh: warning: musl-gcc not found (apt-get install musl-tools); building with glibc's" \
       "gcc -static: a larger binary that starts more slowly" >&2
else
  echo "build.sh: no C compiler: install musl-tools (musl-gcc) or gcc" >&2
  exit 1
fi

# The optional -D flag goes in the positional parameters (OUTPUT is already in $output), so
# it stays one argument with its quotes: a C string literal.
set --
if [ -n "${NETAGENT_DEFAULT_SOCKET:-}" ]; then
  case $NETAGENT_DEFAULT_SOCKET in
    /*) ;;
    *) echo "build.sh: NETAGENT_DEFAULT_SOCKET must be an absolute path" >&2; exit 2 ;;
  esac
  if [ "${#NETAGENT_DEFAULT_SOCKET}" -gt 107 ] \
     || printf '%s' "$NETAGENT_DEFAULT_SOCKET" | LC_ALL=C grep -q '[^A-Za-z0-9/._+-]'; then
    echo "build.sh: NETAGENT_DEFAULT_SOCKET must be at most 107 bytes of [A-Za-z0-9/._+-]" >&2
    exit 2
  fi
  set -- "-DDEFAULT_SOCKET=\"$NETAGENT_DEFAULT_SOCKET\""
fi

mkdir -p "$(dirname "$output")"
tmp="$output.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"$cc" -std=c11 -Wall -Wextra -Werror -static -Os -s "$@" -o "$tmp" "$here"/*.c
chmod 0755 "$tmp"
mv -f "$tmp" "$output"
