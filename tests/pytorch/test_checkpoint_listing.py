"""What the Python Handler's start restores when a checkpoint directory holds more than
holdfast's checkpoints (packaging/python/holdfast_torch/__init__.py, holdfast_torch.cpp): an older
checkpoint whose metadata file is damaged, then the newest one damaged too and an empty
step-N/ made by hand. The start never fails (no FormatError): it restores the newest checkpoint
that counts, and stderr names each skipped directory once. One task over a file:// store; each
start in a child process, as a relaunch is.

    /path/to/venv/bin/python tests/pytorch/test_checkpoint_listing.py [name ...]

Exits non-zero when a case fails; the last line is "N passed, M failed".
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

hf = sup.load_holdfast()
ext = hf.load_extension()

CASES, case = sup.case_list()


check = sup.check

# One start: a CheckpointManager and a Handler (restore agreement on, one task) in `d`; prints
# {"restored": step, "state": what the restore loaded, "steps": the listing} on stdout. argv:
# d, the launch number, the steps to save after the start.
CHILD = textwrap.dedent("""
    import json, os, sys
    import holdfast_torch as hf
    d, launch, saves = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    state = {"v": None}
    def save(path, step):
        with open(os.path.join(path, "state"), "w") as f:
            f.write(str(step))
    def restore(path, step):
        with open(os.path.join(path, "state")) as f:
            state["v"] = int(f.read())
    ckpt = hf.CheckpointManager(os.path.join(d, "ckpt"), save=save, restore=restore,
                                max_to_keep=0)
    with hf.Handler(store="file://" + os.path.join(d, "kv"), checkpoints=ckpt, task=0,
                    num_tasks=1, run_id="listing", restart=launch) as h:
        restored = h.restored_step
        for s in saves:
            ckpt.save(s)
        ckpt.all_steps()  # a second listing: nothing new on stderr
        print(json.dumps({"restored": restored, "state": state["v"],
                          "steps": ckpt.all_steps()}), flush=True)
""")


def start(d, launch, *saves):
    """One start in a child: (its JSON line, its stderr)."""
    p = subprocess.run([sys.executable, "-c", CHILD, d, str(launch)] + [str(s) for s in saves],
                       capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"the start failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def skipped_lines(err, name):
    return [line for line in err.splitlines() if f"/{name}' (step " in line and "skipped" in line]


@case
def damaged_and_hand_made_directories_never_fail_the_start():
    """An older checkpoint's metadata damaged: the start restores the newest (no FormatError)
    and names the damaged one once. Then the newest loses a recorded file, the pointer is
    removed and an empty step-50/ made by hand: the start restores the newest checkpoint that
    counts, 5, and names step-15 and step-50 once each."""
    with tempfile.TemporaryDirectory() as d:
        out, _ = start(d, 0, 5, 10, 15)
        check(out["steps"] == [5, 10, 15], f"saved 5, 10, 15: {out}")
        ckpt = os.path.join(d, "ckpt")
        with open(os.path.join(ckpt, "step-10", "holdfast-metadata.json"), "w") as f:
            f.write('{"format": "holdfast-checkpoint-metad')  # torn
        out, err = start(d, 1)
        check(out["restored"] == 15 and out["state"] == 15, f"restored the newest, 15: {out}")
        check(out["steps"] == [5, 15], f"listed without the damaged step 10: {out}")
        lines = skipped_lines(err, "step-10")
        check(len(lines) == 1 and "holdfast-metadata.json is damaged" in lines[0],
              f"step-10 named once as damaged: {lines}; stderr: {err[-1500:]}")

        os.remove(os.path.join(ckpt, "step-15", "state"))  # a recorded file gone
        os.remove(os.path.join(ckpt, "latest"))
        os.mkdir(os.path.join(ckpt, "step-50"))
        out, err = start(d, 2)
        check(out["restored"] == 5 and out["state"] == 5,
              f"restored the newest checkpoint that counts, 5 (not 50, not 15): {out}")
        check(out["steps"] == [5], f"only step 5 listed: {out}")
        for name, why in (("step-15", "does not match the metadata"), ("step-50", "it is empty")):
            lines = skipped_lines(err, name)
            check(len(lines) == 1 and why in lines[0], f"{name} named once ({why}): {lines}")


if __name__ == "__main__":
    sup.exit_now(sup.run_cases(CASES, sys.argv[1:]))
