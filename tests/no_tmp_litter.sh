#!/usr/bin/env bash
# Runs a command with a private TMPDIR and fails when the run leaves anything behind: an entry
# in that TMPDIR, or a new holdfast-named entry of the kinds the examples make in /tmp itself
# (a program that ignores TMPDIR). On failure it prints a line starting with "litter:" (for CTest
# tests that judge by output) and exits 1; otherwise it exits with the command's status.
#
#   bash tests/no_tmp_litter.sh COMMAND [ARGS...]
set -u
list_tmp() {
  ls -A /tmp 2>/dev/null |
    grep -E '^holdfast-(training|cache|ddp|quickstart|tour-handler|tour-evaluator)-' | sort
}
private=$(mktemp -d /tmp/holdfast-litter-check.XXXXXX) || exit 2
before=$(list_tmp)
TMPDIR=$private "$@"
rc=$?
after=$(list_tmp)
left=$(ls -A "$private")
new=$(comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | sed '/^$/d')
rm -rf "$private"
if [ -n "$left" ] || [ -n "$new" ]; then
  echo "litter: the run left in its TMPDIR: [${left//$'\n'/ }]; new in /tmp: [${new//$'\n'/ }]"
  exit 1
fi
exit "$rc"
