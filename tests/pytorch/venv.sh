#!/usr/bin/env bash
# Prints the path of a Python that has the pinned torch (examples/pytorch/requirements.txt),
# creating or updating the virtual environment first:
#
#   python=$(bash tests/pytorch/venv.sh)
#
# The environment lives outside the clone, in $HOLDFAST_VENV (default /var/cache/holdfast/
# torch-venv as root, else ~/.cache/holdfast/torch-venv), and is reused while the requirements
# file is unchanged (a copy of it is kept inside the environment as the stamp). It is built on
# Debian's /usr/bin/python3 (python3-venv, python3-dev for the extension's headers; tests/run
# installs them). pip's progress goes to stderr; only the path goes to stdout. It replaces only an
# environment it made itself (the marker file holdfast-venv, or the stamp of an older version of
# this script): one of yours named by HOLDFAST_VENV is refused, never deleted.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
req=$here/examples/pytorch/requirements.txt
if [ -z "${HOLDFAST_VENV:-}" ]; then
  if [ "$(id -u)" -eq 0 ]; then HOLDFAST_VENV=/var/cache/holdfast/torch-venv
  else HOLDFAST_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/holdfast/torch-venv; fi
fi
venv=$HOLDFAST_VENV
stamp=$venv/holdfast-requirements.txt
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
marker=$venv/holdfast-venv
pins=$(grep -v '^#' "$req" | xargs)
if [ -e "$venv" ] && [ ! -e "$marker" ] && [ ! -e "$stamp" ] && [ -n "$(ls -A "$venv")" ]; then
  echo "tests/pytorch/venv.sh: $venv is not an environment this script made (no $marker);" \
    "it is left alone: set HOLDFAST_VENV to a new directory, or install" \
    "$pins into it and copy $req to $stamp" >&2
  exit 1
fi
start=$SECONDS
echo "tests/pytorch/venv.sh: creating $venv with $pins" >&2
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
/usr/bin/python3 -m venv "$venv" >&2
echo "made by holdfast's tests/pytorch/venv.sh; it replaces this environment when $req changes" >"$marker"
"$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$req" >&2
cp "$req" "$stamp"
echo "tests/pytorch/venv.sh: ready in $((SECONDS - start)) s" >&2
echo "$venv/bin/python"
