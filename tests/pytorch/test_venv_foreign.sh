#!/usr/bin/env bash
# venv.sh replaces only an environment it made itself: pointed by HOLDFAST_VENV at a directory of
# the user's (here one holding a file and a bin/python), it refuses with a message naming the
# directory and the marker, and leaves every file where it was.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/bin"
echo mine >"$dir/keep.txt"
printf '#!/bin/sh\nexit 0\n' >"$dir/bin/python" && chmod +x "$dir/bin/python"
status=0
HOLDFAST_VENV=$dir bash tests/pytorch/venv.sh >"$dir.out" 2>"$dir.err" || status=$?
out=$(cat "$dir.out") err=$(cat "$dir.err")
rm -f "$dir.out" "$dir.err"
[ "$status" -ne 0 ] || { echo "venv.sh accepted a foreign environment: $out" >&2; exit 1; }
[ -z "$out" ] || { echo "venv.sh printed a python for a foreign environment: $out" >&2; exit 1; }
grep -qF "$dir is not an environment this script made" <<<"$err" ||
  { echo "venv.sh's refusal does not name the directory: $err" >&2; exit 1; }
grep -qF "$dir/holdfast-venv" <<<"$err" || { echo "no marker named: $err" >&2; exit 1; }
[ "$(cat "$dir/keep.txt")" = mine ] && [ -x "$dir/bin/python" ] ||
  { echo "venv.sh touched the foreign environment" >&2; exit 1; }
echo "venv.sh left $dir alone: $err"
