#!/usr/bin/env bash
# The two Slurm recipes in examples/pytorch/slurm/, run with plain bash and signalled the way
# Slurm signals them (there is no Slurm here):
#
#   (a) train.sbatch (--signal=B:USR1@N): SIGUSR1 to the batch shell only. Its trap writes the
#       notice file; every worker saves at one agreed step and exits 143; the script exits with
#       torchrun's status. Run again (a requeue): every rank restores that step and the final
#       state equals an uninterrupted run's (2 workers: bit for bit).
#   (b) srun.sbatch (--signal=USR1@N): SIGUSR1 to torchrun, the step's task. With
#       --signals-to-handle the agent forwards it: the same agreed save and exit 143. Control:
#       torchrun without the flag dies of SIGUSR1 and no worker saves.
#
#   bash tests/pytorch/test_slurm_recipes.sh     (a torchrun whose python has holdfast_torch
#                                                 installed first on PATH: tests/pytorch/run.sh)
#
# Prints PASS/FAIL per check; exits 0 only when all pass. The workers run train.py through a
# probe (HOLDFAST_TRAIN_SCRIPT) that prints when the handler runs its first step and the code
# each worker exits with (torchrun does not report the codes of workers it shut down).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
repo=$PWD
unset "${!SLURM_@}"  # outside Slurm: the recipes must not call scontrol or srun
command -v torchrun >/dev/null || { echo "FAIL no torchrun on PATH"; exit 1; }
python=$(dirname "$(command -v torchrun)")/python  # torchrun's own environment
STEPS=160  # 8 s of steps at train.py's 0.05 s
scratch=$(mktemp -d /tmp/holdfast-slurm.XXXXXX)
started=$SECONDS
failed=0
bg=()  # pids this script started

cleanup() {  # our shells, then every process whose command line names our scratch directory
  local p
  for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in $(grep -lsF "$scratch" /proc/[0-9]*/cmdline | cut -d/ -f3); do
    [ "$p" != $$ ] && kill -KILL "$p" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

check() {  # CONDITION-STATUS WHAT
  if [ "$1" -eq 0 ]; then echo "PASS $2"; else echo "FAIL $2"; failed=$((failed + 1)); fi
}
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
latest() { sed -n 's/^latest step-//p' "$1/ckpt/rank-$2/latest" 2>/dev/null; }
probe_codes() { grep -so 'probe: rank [0-9]* exits [0-9-]* ([A-Za-z]*)' "$1" | sort | tr '\n' ';'; }
sha_of() { grep -so 'final state sha256 [0-9a-f]\{64\}' "$1" | cut -d' ' -f4; }  # lines can interleave
wait_for() {  # SECONDS COMMAND...: poll every 0.1 s
  local end=$((SECONDS + $1))
  shift
  while [ $SECONDS -lt $end ]; do "$@" && return 0; sleep 0.1; done
  return 1
}
both_running() { [ "$(grep -so 'probe: rank [0-9]* running' "$1" | sort -u | wc -l)" -ge 2 ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }
show() { grep -v 'socket.cpp\|^\*\*\*\|OMP_NUM_THREADS\|^W1.*\*\*\*' "$1" | tail -n "${2:-25}" | sed 's/^/    /'; }

cat >"$scratch/probe.py" <<'EOF'
import os, runpy, sys
script = os.environ["PROBE_SCRIPT"]
sys.argv[0] = script
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
import holdfast_torch  # the module train.py imports
def say(line):  # one write: torchrun runs workers unbuffered (-u), print writes "\n" apart
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
rank = os.environ.get("RANK")
run, said = holdfast_torch.Handler.run, []
def first_run(self, *a, **k):
    if not said:
        said.append(1)
        say(f"probe: rank {rank} running (handler's first step)")
    return run(self, *a, **k)
holdfast_torch.Handler.run = first_run
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    say(f"probe: rank {rank} exits {e.code} ({type(e).__name__})")
    raise
say(f"probe: rank {rank} exits 0 (finished)")
EOF
export PROBE_SCRIPT=$repo/examples/pytorch/train.py HOLDFAST_TRAIN_SCRIPT=$scratch/probe.py
export NPROC=2 HOLDFAST_STEPS=$STEPS

t=$SECONDS
"$python" -c "import holdfast_torch" >"$scratch/build.log" 2>&1
check $? "holdfast_torch imports under $python ($((SECONDS - t)) s)"
[ $failed -eq 0 ] || { show "$scratch/build.log"; exit 1; }

# (a) train.sbatch ------------------------------------------------------------------------------
t=$SECONDS
HOLDFAST_RUN_DIR=$scratch/ref MASTER_PORT=$(free_port) \
  timeout -k 5 300 bash examples/pytorch/slurm/train.sbatch >"$scratch/ref.log" 2>&1
rc=$?
ref=$(sha_of "$scratch/ref.log")
check $(( rc != 0 || ${#ref} != 64 )) "train.sbatch, no signal: exit $rc, sha256 ${ref:0:16}… ($((SECONDS - t)) s)"
[ $rc -eq 0 ] || show "$scratch/ref.log"

t=$SECONDS
run=$scratch/a
# [snippet usr1]
HOLDFAST_RUN_DIR=$run HOLDFAST_GRACE=0 MASTER_PORT=$(free_port) \
  bash examples/pytorch/slurm/train.sbatch >"$scratch/a1.log" 2>&1 &
sh=$!
bg+=("$sh")
wait_for 240 both_running "$scratch/a1.log"
check $? "train.sbatch: both workers reached the handler's first step ($((SECONDS - t)) s)"
sleep 1  # some steps in
t=$SECONDS
kill -USR1 "$sh"  # --signal=B:USR1@N: the batch shell only
# [/snippet usr1]
wait_for 60 gone "$sh"
wait "$sh"
rc=$?
said=$(sed -n 's/^train.sbatch: torchrun exited with //p' "$scratch/a1.log")
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$said" = "$rc" ]
check $? "train.sbatch exited $((SECONDS - t)) s after SIGUSR1 to the batch shell: $rc, torchrun's status ($said)"
[ -e "$run/preempt-notice" ]
check $? "the trap wrote the notice file"
codes=$(probe_codes "$scratch/a1.log")
[ "$codes" = "probe: rank 0 exits 143 (Preempted);probe: rank 1 exits 143 (Preempted);" ]
check $? "every worker raised Preempted(143): $codes"
grep -q 'exitcode *: 143' "$scratch/a1.log"
check $? "torchrun saw a worker exit 143"
s0=$(latest "$run" 0) s1=$(latest "$run" 1)
[ -n "$s0" ] && [ "$s0" = "$s1" ] && [ "$s0" -gt 0 ] && [ "$s0" -lt $STEPS ] && ! grep -q sha256 "$scratch/a1.log"
check $? "every rank saved one agreed step: rank-0 ${s0:-none}, rank-1 ${s1:-none} (of $STEPS)"
[ $failed -eq 0 ] || show "$scratch/a1.log"

t=$SECONDS
HOLDFAST_RUN_DIR=$run MASTER_PORT=$(free_port) \
  timeout -k 5 300 bash examples/pytorch/slurm/train.sbatch >"$scratch/a2.log" 2>&1
rc=$?
restored=$(grep -o 'rank [0-9]*: restored step [0-9]*' "$scratch/a2.log" | sort | tr '\n' ';')
got=$(sha_of "$scratch/a2.log")
[ ! -e "$run/preempt-notice" ] && [ "$restored" = "rank 0: restored step $s0;rank 1: restored step $s0;" ]
check $? "requeue: notice removed, every rank restored step $s0: $restored"
check $(( rc != 0 || ${#got} != 64 )) "requeue finished: exit $rc ($((SECONDS - t)) s)"
[ "$got" = "$ref" ]
check $? "requeue's final state equals the uninterrupted run's: ${got:0:16}… vs ${ref:0:16}…"
if [ "$rc" -ne 0 ] || [ "$got" != "$ref" ]; then show "$scratch/a2.log"; fi

# (b) srun.sbatch -------------------------------------------------------------------------------
torchrun_child() { pgrep -P "$1" -f torchrun | head -n 1; }
t=$SECONDS
run=$scratch/b
HOLDFAST_RUN_DIR=$run HOLDFAST_GRACE=0 MASTER_PORT=$(free_port) LEAD=20 \
  bash examples/pytorch/slurm/srun.sbatch >"$scratch/b1.log" 2>&1 &
sh=$!
bg+=("$sh")
wait_for 240 both_running "$scratch/b1.log"
check $? "srun.sbatch: both workers reached the handler's first step ($((SECONDS - t)) s)"
sleep 1
t=$SECONDS
agent=$(torchrun_child "$sh")
[ -n "$agent" ] && kill -USR1 "$agent" 2>/dev/null  # --signal=USR1@N: the step's task, torchrun
check $? "SIGUSR1 sent to torchrun (pid ${agent:-none})"
wait_for 60 gone "$sh"
wait "$sh"
rc=$?
grep -q 'closing signal SIGUSR1' "$scratch/b1.log"
check $? "torchrun forwarded SIGUSR1 to the workers; srun.sbatch exited $((SECONDS - t)) s later: $rc"
codes=$(probe_codes "$scratch/b1.log")
[ "$codes" = "probe: rank 0 exits 143 (Preempted);probe: rank 1 exits 143 (Preempted);" ]
check $? "every worker raised Preempted(143): $codes"
s0=$(latest "$run" 0) s1=$(latest "$run" 1)
[ -n "$s0" ] && [ "$s0" = "$s1" ] && [ "$s0" -gt 0 ] && [ "$s0" -lt $STEPS ]
check $? "every rank saved one agreed step: rank-0 ${s0:-none}, rank-1 ${s1:-none} (of $STEPS)"
[ $failed -eq 0 ] || show "$scratch/b1.log"

# Control: the recipe's torchrun line without --signals-to-handle.
t=$SECONDS
run=$scratch/c
torchrun --nproc-per-node=2 --max-restarts=3 --master-port="$(free_port)" --shutdown-timeout=20 \
  "$HOLDFAST_TRAIN_SCRIPT" --dir "$run" --preset slurm --grace 0 --steps 400 >"$scratch/c.log" 2>&1 &
agent=$!
bg+=("$agent")
wait_for 240 both_running "$scratch/c.log"
workers=$(pgrep -P "$agent" | tr '\n' ' ')
sleep 1
kill -USR1 "$agent"
{ wait_for 10 gone "$agent"; wait "$agent"; } 2>/dev/null  # no "User defined signal 1" line
rc=$?
sleep 3  # time enough for an agreed save, had the workers been told
check $(( rc != 128 + 10 )) "control: torchrun without --signals-to-handle died of SIGUSR1 (status $rc)"
codes=$(probe_codes "$scratch/c.log")
alive=$(for p in $workers; do kill -0 "$p" 2>/dev/null && echo "$p"; done | wc -l)
[ -n "$workers" ] && [ -z "$codes" ] && [ -z "$(latest "$run" 0)$(latest "$run" 1)" ]
check $? "control: 3 s later no worker saved or exited (${codes:-no exits}); $alive orphaned workers still running"
for p in $workers; do kill -KILL "$p" 2>/dev/null; done
echo "($((SECONDS - t)) s)"

echo "test_slurm_recipes: $([ $failed -eq 0 ] && echo PASS || echo "FAIL ($failed)") in $((SECONDS - started)) s"
[ $failed -eq 0 ]
