#!/usr/bin/env bash
# What including holdfast costs a build, each figure beside its baseline (issue 43, item 2):
#
#   bash benchmarks/compile_time.sh [--runs N] [--cxx g++|clang++] [--std c++17] [--only NAME]
#                                   [--python PATH] [--tsv]
#
# Every figure is the CPU time (user + sys) of the compiler process and the processes it ran
# (cc1plus, as), read from getrusage(RUSAGE_CHILDREN) around each run: wall time on a shared
# CI machine measures the neighbours as much as the compiler. Each is the median of --runs runs
# (default 5), with the fastest run beside it. One line per figure:
#
#   name                    median_s  min_s  baseline_s  ratio  baseline
#
# name is THING:MODE, MODE one of syntax (-fsyntax-only), O0 (-c -O0), O2 (-c -O2); --only
# takes a name or a glob of names ('kv/*', '*:O2') and measures that row and its baseline.
#
#   baseline:MODE            a TU with only the standard and POSIX headers include/holdfast uses
#                            (the list below, frozen: see it); its baseline columns are "-"
#   holdfast.hpp:syntax|O0   #include <holdfast/holdfast.hpp>, against baseline:syntax|O0
#   X.hpp:syntax             each header the umbrella includes (publish.hpp, kv/etcd.hpp, ...,
#                            read from holdfast.hpp at run time), alone, against baseline:syntax
#                            (under 1: that header pulls in only part of the baseline's list)
#   tour_handler.cpp:O0|O2   examples/tour_handler.cpp, against baseline:O0|O2; the same for
#                            every examples/tour_*workers*.cpp there is ("n/a" when none)
#   torch_headers:O2         torch's own headers alone, as the binding included them when the
#                            goal was set (Python.h, <torch/extension.h>, the c10d Store header;
#                            frozen, so narrowing the binding's includes does not move it), with
#                            torch's flags
#   binding_includes:O2      the binding's <...> includes today but holdfast's, read from it at
#                            run time (what holdfast_torch.cpp costs without holdfast)
#   holdfast_torch.cpp:O2    packaging/python/holdfast_torch.cpp, against torch_headers:O2
#
# The torch rows use the flags torch's extension builder gives the extension (as
# packaging/python/setup.py builds it: its -D flags, -isystem include_paths() and Python's
# include directory, -fPIC, the -std torch chooses, then -O2 -fvisibility=hidden; setup.py also
# passes -g0 over Python's -g, which these rows never add),
# read from torch in the environment tests/pytorch/venv.sh makes ($HOLDFAST_VENV, else
# /var/cache/holdfast/torch-venv or ~/.cache/holdfast/torch-venv; --python or
# $HOLDFAST_TORCH_PYTHON picks another interpreter; they match build/python/temp.*/build.ninja).
# This script never creates that environment: with no importable torch these rows print
# "n/a (no torch)". --std applies to the other rows only.
#
# A full run compiles about 150 times (with g++ 12 on a 2-core machine: 3 minutes, 7 with the
# torch rows). Scratch files live in one mktemp -d directory, removed on exit. Needs bash, python3
# and the compiler; nothing else.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
runs=5
cxx=g++
std=c++17
only=
tsv=0
python_torch=${HOLDFAST_TORCH_PYTHON:-}

usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:?--runs N}; shift 2 ;;
    --cxx) cxx=${2:?--cxx COMPILER}; shift 2 ;;
    --std) std=${2:?--std STANDARD}; shift 2 ;;
    --only) only=${2:?--only NAME}; shift 2 ;;
    --python) python_torch=${2:?--python PATH}; shift 2 ;;
    --tsv) tsv=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compile_time.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
case $runs in
  '' | *[!0-9]* | 0) echo "compile_time.sh: --runs takes a positive number" >&2; exit 2 ;;
esac
command -v "$cxx" >/dev/null || { echo "compile_time.sh: no compiler '$cxx'" >&2; exit 2; }

scratch=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-compile-time.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
trap 'exit 130' INT TERM

# The baseline TU: every <...> header include/holdfast/** included at commit a72744d (2026-12-02,
# `grep -rhoE '#include <[^>]+>' include/holdfast | sort -u`: 62 headers). FROZEN ON PURPOSE:
# do not regenerate it. When holdfast stops including a heavy header, its rows should get
# cheaper against an unchanged baseline; a baseline recomputed from include/ would get cheaper
# with them and hide the gain. Guards as in the headers that include them.
cat >"$scratch/baseline.cpp" <<'EOF'
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <clocale>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <ratio>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_set>
#include <utility>
#include <vector>
#if defined(__GNUC__) || defined(__clang__)
#include <cxxabi.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
int main() { return 0; }
EOF

# Runs a command RUNS times; prints "median min" of its CPU seconds (user + sys of it and its
# children), or its stderr's tail and status 1 when a run fails.
timer='
import resource, statistics, subprocess, sys
runs, cmd = int(sys.argv[1]), sys.argv[2:]
def cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
times = []
for _ in range(runs):
    before = cpu()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    times.append(cpu() - before)
    if p.returncode != 0:
        sys.stderr.write("\n".join(p.stderr.decode(errors="replace").splitlines()[-15:]) + "\n")
        sys.exit(1)
print(f"{statistics.median(times):.3f} {min(times):.3f}")
'

declare -A median fastest state  # by row name; state: ok, failed, or the reason it is n/a
declare -A cmdline                # the compile command of each row (a NUL-free, tab-joined argv)
names=()                          # rows in order
declare -A against                # a row's baseline row

# add NAME BASELINE REASON-OR-EMPTY ARGV...: one row (REASON: why it is n/a).
add() {
  local name=$1 base=$2 na=$3
  shift 3
  names+=("$name")
  against[$name]=$base
  state[$name]=$na
  local IFS=$'\t'
  cmdline[$name]="$*"
}

add_hf() {  # NAME BASELINE MODE SOURCE: a holdfast row, a TU of one #include or a source file
  local name=$1 base=$2 mode=$3 src=$4 flags
  case $mode in
    syntax) flags=(-fsyntax-only) ;;
    O0) flags=(-c -O0 -o "$scratch/out.o") ;;
    O2) flags=(-c -O2 -o "$scratch/out.o") ;;
  esac
  add "$name" "$base" "" "$cxx" "-std=$std" -I "$repo/include" "${flags[@]}" "$src"
}

for m in syntax O0 O2; do
  add_hf "baseline:$m" - "$m" "$scratch/baseline.cpp"
done
echo '#include <holdfast/holdfast.hpp>' >"$scratch/holdfast.cpp"
add_hf holdfast.hpp:syntax baseline:syntax syntax "$scratch/holdfast.cpp"
add_hf holdfast.hpp:O0 baseline:O0 O0 "$scratch/holdfast.cpp"
while read -r header; do  # the umbrella's own list: a component added there gets a row
  tu=$scratch/tu-${header//\//_}.cpp
  echo "#include <holdfast/$header>" >"$tu"
  add_hf "$header:syntax" baseline:syntax syntax "$tu"
done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/p' \
  "$repo/include/holdfast/holdfast.hpp")
add_hf tour_handler.cpp:O0 baseline:O0 O0 "$repo/examples/tour_handler.cpp"
add_hf tour_handler.cpp:O2 baseline:O2 O2 "$repo/examples/tour_handler.cpp"
shopt -s nullglob
workers=("$repo"/examples/tour_*workers*.cpp)
shopt -u nullglob
if [ ${#workers[@]} -eq 0 ]; then
  add 'tour_*workers*.cpp:O0' baseline:O0 "n/a (no examples/tour_*workers*.cpp)"
  add 'tour_*workers*.cpp:O2' baseline:O2 "n/a (no examples/tour_*workers*.cpp)"
else
  for w in "${workers[@]}"; do
    add_hf "$(basename "$w"):O0" baseline:O0 O0 "$w"
    add_hf "$(basename "$w"):O2" baseline:O2 O2 "$w"
  done
fi

# The torch rows: torch is looked for only when they are to run.
want_torch=0
torch_note=
# shellcheck disable=SC2053  # --only is a glob on purpose
if [ -z "$only" ] || [[ torch_headers:O2 == $only || binding_includes:O2 == $only ||
  holdfast_torch.cpp:O2 == $only ]]; then
  want_torch=1
fi
binding=$repo/packaging/python/holdfast_torch.cpp
torch_na=
torch_flags=()
if [ "$want_torch" = 1 ]; then
  if [ -z "$python_torch" ]; then
    for v in "${HOLDFAST_VENV:-}" /var/cache/holdfast/torch-venv \
      "${XDG_CACHE_HOME:-$HOME/.cache}/holdfast/torch-venv"; do
      if [ -n "$v" ] && [ -x "$v/bin/python" ]; then python_torch=$v/bin/python; break; fi
    done
  fi
  [ -n "$python_torch" ] || python_torch=python3
  # The flags torch.utils.cpp_extension.load writes into the extension's build.ninja: its own
  # function is called with _write_ninja_file replaced by one that keeps the flags (so they are
  # torch's, whatever the version); where that fails, the same list assembled from its parts.
  # One flag a line; the ninja file is run by a shell, hence shlex.
  flags_py='
import contextlib, inspect, io, os, re, shlex, sys, sysconfig, warnings
warnings.simplefilter("ignore")
with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
    import torch
    from torch.utils import cpp_extension as ce
src, include, scratch = sys.argv[1:4]
extra = ["-O2", "-fvisibility=hidden"]
flags = None
try:
    kept = {}
    def keep(*args, **kwargs):
        kept.update(kwargs)
    write, ce._write_ninja_file = ce._write_ninja_file, keep
    try:
        known = dict(path=os.path.join(scratch, "build.ninja"), name="holdfast_torch",
                     sources=[src], extra_cflags=extra, extra_cuda_cflags=[], extra_ldflags=[],
                     extra_include_paths=[include], with_cuda=False, is_python_module=True,
                     is_standalone=False)
        f = ce._write_ninja_file_to_build_library
        params = inspect.signature(f).parameters
        # A parameter a newer torch added: extra_*_cflags empty, with_* False.
        args = {k: known.get(k, [] if k.startswith("extra_") else False)
                for k, p in params.items() if k in known or p.default is p.empty}
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            f(**args)
    finally:
        ce._write_ninja_file = write
    flags = shlex.split(" ".join(kept["cflags"] + (kept.get("post_cflags") or [])))
except Exception:
    flags = ["-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for part in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        if hasattr(ce, part):
            flags += shlex.split(" ".join(getattr(ce, part)()))
        elif part.startswith("_get_glibcxx") and hasattr(torch._C, "_GLIBCXX_USE_CXX11_ABI"):
            flags += ["-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]
    flags += ["-I" + include]
    for d in ce.include_paths() + [sysconfig.get_path("include", scheme="posix_prefix")]:
        flags += ["-isystem", d]
    try:  # the standard that function passes (C++20 since torch 2.10)
        std = re.search(r"-std=(c\+\+\d+)",
                        inspect.getsource(ce._write_ninja_file_to_build_library))
    except Exception:
        std = None
    flags += ["-fPIC", "-std=" + (std.group(1) if std else "c++17")] + extra
print("\n".join(flags))
'
  if ! "$python_torch" -c 'import torch' >/dev/null 2>&1; then
    torch_na="n/a (no torch)"
    torch_note="no torch importable by $python_torch"
  else
    mapfile -t torch_flags < <(
      "$python_torch" -c "$flags_py" "$binding" "$repo/include" "$scratch" || true)
  fi
  if [ -z "$torch_na" ] && [ ${#torch_flags[@]} -eq 0 ]; then
    torch_na="n/a (torch's flags not found)"
  fi
fi
# torch's headers as the binding included them when issue 43 set the goal (frozen).
printf '%s\n' '#include <Python.h>' '#include <torch/extension.h>' \
  '#include <torch/csrc/distributed/c10d/Store.hpp>' >"$scratch/torch_headers.cpp"
add torch_headers:O2 - "$torch_na" "$cxx" "${torch_flags[@]}" -c -o "$scratch/out.o" \
  "$scratch/torch_headers.cpp"
# The binding's own <...> includes today but holdfast's, in its order.
grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*<' "$binding" | grep -v '<holdfast/' \
  >"$scratch/binding_includes.cpp"
add binding_includes:O2 torch_headers:O2 "$torch_na" "$cxx" "${torch_flags[@]}" -c \
  -o "$scratch/out.o" "$scratch/binding_includes.cpp"
add holdfast_torch.cpp:O2 torch_headers:O2 "$torch_na" "$cxx" "${torch_flags[@]}" -c \
  -o "$scratch/out.o" "$binding"

measure() {  # NAME: fills median/fastest, once
  local name=$1 out argv
  [ -z "${state[$name]}" ] || return 0
  IFS=$'\t' read -r -a argv <<<"${cmdline[$name]}"
  # TMPDIR: the compiler's own temporaries (cc*.s) in the scratch directory too, where nothing
  # that cleans /tmp meanwhile takes them away
  if out=$(cd "$scratch" && TMPDIR=$scratch python3 -c "$timer" "$runs" "${argv[@]}" \
    2>"$scratch/err"); then
    median[$name]=${out% *}
    fastest[$name]=${out#* }
    state[$name]=ok
  else
    state[$name]=failed
    echo "compile_time.sh: $name failed to compile:" >&2
    sed 's/^/    /' "$scratch/err" >&2
  fi
}

ratio() {
  python3 -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$1" "$2"
}

row() {  # NAME MEDIAN MIN BASELINE RATIO AGAINST
  if [ "$tsv" = 1 ]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@"
  else
    printf '%-28s %9s %7s %11s %6s  %s\n' "$@"
  fi
}

selected=()
for name in "${names[@]}"; do
  # shellcheck disable=SC2053  # --only is a glob on purpose
  if [ -z "$only" ] || [[ $name == $only ]]; then selected+=("$name"); fi
done
if [ ${#selected[@]} -eq 0 ]; then
  echo "compile_time.sh: no row matches '$only'; the rows:" >&2
  printf '  %s\n' "${names[@]}" >&2
  exit 2
fi

if [ "$tsv" = 1 ]; then
  row name median_s min_s baseline_s ratio baseline
else
  torch_std=$(printf '%s\n' "${torch_flags[@]}" | grep -- '^-std=' | tail -n 1 || true)
  echo "# $("$cxx" --version | head -n 1); holdfast rows -std=$std," \
    "torch rows torch's flags${torch_std:+ ($torch_std)}"
  echo "# CPU seconds (user+sys of the compiler and its children), median of $runs runs"
  if [ -n "$torch_note" ]; then echo "# torch rows: $torch_note"
  elif [ ${#torch_flags[@]} -gt 0 ]; then echo "# torch rows: torch from $python_torch"; fi
  row name median_s min_s baseline_s ratio baseline
fi
status=0
for name in "${selected[@]}"; do
  base=${against[$name]}
  case ${state[$name]} in
    n/a*)  # the reason in one piece, past the columns it has no figures for
      if [ "$tsv" = 1 ]; then row "$name" "${state[$name]}" - - - "$base"
      else printf '%-28s %s\n' "$name" "${state[$name]}"; fi
      continue ;;
  esac
  [ "$base" = - ] || measure "$base"
  measure "$name"
  if [ "${state[$name]}" != ok ]; then
    row "$name" "failed" - - - "$base"
    status=1
  elif [ "$base" = - ]; then
    row "$name" "${median[$name]}" "${fastest[$name]}" - - -
  elif [ "${state[$base]}" != ok ]; then
    row "$name" "${median[$name]}" "${fastest[$name]}" "${state[$base]}" - "$base"
  else
    row "$name" "${median[$name]}" "${fastest[$name]}" "${median[$base]}" \
      "$(ratio "${median[$name]}" "${median[$base]}")" "$base"
  fi
done
exit "$status"  # 1: a row failed to compile (its errors are on stderr)
