#!/usr/bin/env bash
# The PyTorch suite, as tests/run runs it (one step, not per preset):  bash tests/pytorch/run.sh
#
# On the pinned torch (examples/pytorch/requirements.txt, in the environment tests/pytorch/
# venv.sh makes and reuses) it makes a fresh virtual environment, build/pytorch-env, that reuses
# the torch environment's packages (a .pth file; PIP_NO_INDEX: nothing is downloaded), runs
# there the install commands examples/pytorch/README.md shows (pip builds the extension once
# and installs holdfast_torch), makes the wheel (build/pytorch-wheel) and installs it in their
# place, then runs each case below with that environment's python and torchrun, one after
# another, from a directory outside the clone (test_slurm_recipes.sh and test_venv_foreign.sh
# work in the clone, as the recipes do): every case imports the installed wheel, never the
# sources (nothing of the clone named holdfast_torch is on a case's sys.path). Each must end
# well (the driver prints "verdict: PASS", the other scripts exit 0). A loopback etcd is
# started for the etcd:// case and stopped on exit. The last line is "N passed, M failed".
# HOLDFAST_PYTORCH_ONLY=name,name runs only those cases. With --build-only it makes the
# environments, the package and the multi-node tool, and runs nothing (tests/run does that in
# the background while other suites run, then runs this with HOLDFAST_PYTORCH_INSTALLED=1: the
# environment it made is used as it is).
set -uo pipefail
build_only=0
[ "${1:-}" = --build-only ] && build_only=1
cd "$(dirname "$0")/../.."
repo=$PWD
python=$(bash tests/pytorch/venv.sh) || { echo "tests/pytorch/run.sh: no torch environment" >&2; exit 1; }
wheels=$repo/build/pytorch-wheel
env=$repo/build/pytorch-env
scratch=$(mktemp -d /tmp/holdfast-pytorch.XXXXXX)
etcd_pid=
cleanup() {
  [ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT

echo "== pytorch: $("$python" -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0])')"
start=$SECONDS
# A fresh environment on every run, where the README's install commands run as written: the torch
# environment's packages come in through a .pth file (PIP_NO_INDEX: pip may fetch nothing, so
# the pinned torch is the cached one), and pip builds the extension once (its objects are kept
# in build/python, so a rerun recompiles only what changed). Then `pip wheel` makes the wheel
# (build/pytorch-wheel) and the wheel is installed in place of the directory's install: the
# suite tests the wheel. torchrun here starts this environment's python (torch's own torchrun
# would start the workers with the torch environment's python, which has no holdfast_torch).
if [ "${HOLDFAST_PYTORCH_INSTALLED:-}" = 1 ] && [ -x "$env/bin/python" ] && compgen -G "$wheels/*.whl" >/dev/null; then
  python=$env/bin/python
  export PATH="$env/bin:$PATH"
else
  rm -rf "$env" "$wheels"
  # Without pip of its own: an ensurepip setuptools would shadow the torch environment's (the
  # build's), so pip and torchrun are those packages' own, run by this environment's python.
  "$python" -m venv --without-pip "$env" ||  # the torch environment's Python version
    { echo "tests/pytorch/run.sh: no fresh environment" >&2; exit 1; }
  purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  purelib "$python" >"$(purelib "$env/bin/python")/holdfast-torch-env.pth"
  # (Entry-point scripts as pip writes them: the process's command line names the tool.)
  for tool in "pip pip._internal.cli.main" "torchrun torch.distributed.run"; do
    set -- $tool
    printf '#!%s\nimport sys\nfrom %s import main\nsys.exit(main())\n' "$env/bin/python" "$2" >"$env/bin/$1"
    chmod +x "$env/bin/$1"
  done
  python=$env/bin/python
  export PATH="$env/bin:$PATH"  # pip, python and torchrun of this environment first
  export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
  install() {
    set -e
    # [snippet install]
    pip install -r examples/pytorch/requirements.txt      # the pinned torch, or keep your own
    pip install --no-build-isolation ./packaging/python   # builds and installs holdfast_torch
    python -c "import holdfast_torch; print(holdfast_torch.__version__)"
    # [/snippet install]
    # The wheel (the same build: only what changed is compiled again, here nothing), and the
    # suite runs against it installed: pip replaces the directory's install with the wheel's.
    pip wheel -q --no-build-isolation --no-deps -w "$wheels" ./packaging/python
    pip install -q --no-deps --force-reinstall "$wheels"/*.whl
  }
  (install) >"$scratch/install.log" 2>&1  # not in a condition: set -e stops at the first failure
  [ $? -eq 0 ] ||
    { tail -n 60 "$scratch/install.log" >&2; echo "tests/pytorch/run.sh: the package does not install" >&2; exit 1; }
  unset PIP_NO_INDEX
  echo "== pytorch: installed in $((SECONDS - start)) s: $(grep -o 'Successfully installed holdfast-torch-[^ ]*' "$scratch/install.log"), $(basename "$wheels"/*.whl)"
fi
(cd "$scratch" && "$python" -c 'import holdfast_torch as h; print("== pytorch: holdfast_torch", h.__version__, "for torch", h.TORCH_VERSION, "at", h.__file__)') ||
  { echo "tests/pytorch/run.sh: the installed package does not import" >&2; exit 1; }
# The multi-node cases' tool (below), built once.
mn_up=$repo/build/pytorch-tools/multinode_up
mkdir -p "$(dirname "$mn_up")"
if [ ! -x "$mn_up" ] || [ "$mn_up" -ot tests/support/multinode_up.cpp ] ||
  [ -n "$(find include tests/support -newer "$mn_up" -name '*.hpp' -print -quit)" ]; then
  "${CXX:-c++}" -std=c++17 -O1 -Wall -Wextra -Werror -pthread -I include -I tests/support \
    tests/support/multinode_up.cpp -o "$mn_up.tmp" && mv "$mn_up.tmp" "$mn_up" ||
    { echo "tests/pytorch/run.sh: the multi-node tool does not build" >&2; rm -f "$mn_up.tmp"; exit 1; }
fi
echo "== pytorch: package ready in $((SECONDS - start)) s"
[ "$build_only" -eq 1 ] && exit 0

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start_etcd() {
  [ -n "$etcd_pid" ] && return 0
  local client peer
  client=$(free_port)
  peer=$(free_port)
  etcd --data-dir "$scratch/etcd" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "default=http://127.0.0.1:$peer" >"$scratch/etcd.log" 2>&1 &
  etcd_pid=$!
  etcd_url=etcd://127.0.0.1:$client
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$client/health" >/dev/null 2>&1 && return 0
    "$python" -c "import socket; socket.create_connection(('127.0.0.1', $client), 0.2)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "tests/pytorch/run.sh: etcd did not start" >&2
  return 1
}

passed=0
failed=0
failures=()
only=${HOLDFAST_PYTORCH_ONLY:-}
case_() {  # NAME COMMAND...: runs one case, its output in $scratch/NAME.log (shown on failure)
  local name=$1
  shift
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then return 0; fi
  local t=$SECONDS
  if timeout -k 10 600 "$@" >"$scratch/$name.log" 2>&1; then
    if grep -q '^verdict: SKIP' "$scratch/$name.log"; then  # the multi-node cases, no namespaces
      echo "SKIP $name: $(grep -v '^verdict' "$scratch/$name.log" | tail -n 1)"
      return 0
    fi
    passed=$((passed + 1))
    echo "PASS $name ($((SECONDS - t)) s)"
  else
    failed=$((failed + 1))
    failures+=("$name")
    echo "FAIL $name ($((SECONDS - t)) s); its output:"
    tail -n 60 "$scratch/$name.log" | sed 's/^/    /'
  fi
}
# The cases run from a directory outside the clone: what they import is the installed package.
export HOLDFAST_PYTORCH_WHEELS=$wheels  # test_package.py reads the wheel
test_py=(tests/pytorch/test_*.py)
test_sh=(tests/pytorch/test_*.sh)
mkdir "$scratch/cwd"
cd "$scratch/cwd" || exit 1
# [snippet cases]
ddp=("$python" "$repo/examples/pytorch/preemptible_ddp.py")

case_ ddp-default bash "$repo/tests/no_tmp_litter.sh" "${ddp[@]}"  # its own run dir: nothing left in TMPDIR
case_ ddp-kill "${ddp[@]}" --dir "$scratch/kill" --kill
case_ ddp-file "${ddp[@]}" --dir "$scratch/file" --kv="file://$scratch/kv-file"
if [ -z "$only" ] || [[ ",$only," == *",ddp-etcd,"* ]]; then
  start_etcd || { failed=$((failed + 1)); failures+=(etcd); }
fi
[ -n "$etcd_pid" ] && case_ ddp-etcd "${ddp[@]}" --dir "$scratch/etcd" --kv="$etcd_url"
case_ ddp-grace "${ddp[@]}" --dir "$scratch/grace" --grace 3
case_ ddp-torchrun-sigterm "${ddp[@]}" --dir "$scratch/torchrun-sigterm" --preempt torchrun --kv="file://$scratch/kv-relaunch"
case_ ddp-two-tier "${ddp[@]}" --dir "$scratch/two-tier" --local-dir "$scratch/two-tier-local" --new-node --save-policy auto --min-interval 0.3 --mtbi-prior 2 --steps 40
case_ ddp-torchrun-k8s-grace "${ddp[@]}" --dir "$scratch/torchrun-k8s" --preempt torchrun --grace 4 --steps 250 --kv="file://$scratch/kv-k8s"
case_ ddp-hang-sleep "${ddp[@]}" --dir "$scratch/hang-sleep" --hang sleep --workers 3 --steps 30
case_ ddp-hang-stop "${ddp[@]}" --dir "$scratch/hang-stop" --hang stop --workers 2 --steps 24
# [/snippet cases]
# The job across 2 nodes (network namespaces made by tests/support/multinode.hpp through its
# tool multinode_up, built here; root): holdfast over the 3-member etcd with node 1, then node 0
# preempted and relaunched, and store="torch" with node 0 preempted (tests/pytorch/
# multinode_ddp.py). Without namespaces they say SKIP, and fail with CI=true.
multinode=("$python" "$repo/tests/pytorch/multinode_ddp.py" --harness "$mn_up")
[ -x "$mn_up" ] && case_ multinode-etcd "${multinode[@]}" --kv etcd
[ -x "$mn_up" ] && case_ multinode-torch-store "${multinode[@]}" --kv torch
case_ readme-script "$python" "$repo/tests/pytorch/readme_script_test.py" --dir "$scratch/readme"
for t in "${test_py[@]}"; do
  [ -e "$repo/$t" ] && case_ "$(basename "$t" .py)" "$python" "$repo/$t"
done
for t in "${test_sh[@]}"; do
  [ -e "$repo/$t" ] && case_ "$(basename "$t" .sh)" bash "$repo/$t"
done

echo "== pytorch: ${failures[*]:-all cases} $([ $failed -eq 0 ] && echo passed || echo failed) in $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
