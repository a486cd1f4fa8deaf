"""A stand-in for `python -m trainer` that speaks the trainer's protocols without TensorFlow.

Started by the real deployer with `--role R --index I --spec PATH`; reads the real spec (JSON
TrainerSpec). Servers bind their port and report `ready`; the chief probes the PS port before
each step (exit 3 with `failure` `ps_unavailable` when it is gone, like trainer/control.py),
resumes from the newest `ckpt-N` file in the spec's checkpoint_dir, checkpoints every
`job.checkpoint_frequency` steps, writes `DONE` and exits 0; the evaluator waits for `DONE`.
Behaviour knobs come from the JSON file named by env FAKE_ROLE_BEHAVIOUR (all optional):
`step_s`, `resume_delay_s` (a resumed chief waits this long before train_start),
`hang_chief_start` (the chief's Nth start never reaches train_start), `ps_ready_delay_s`
(a restarted PS waits this long before serving).
"""

import argparse
import contextlib
import json
import os
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--role")
parser.add_argument("--index", type=int)
parser.add_argument("--spec")
args = parser.parse_args()


def load(path):
    with open(path) as f:
        return json.load(f)


spec = load(args.spec)
knobs = load(os.environ["FAKE_ROLE_BEHAVIOUR"])
ckpt_dir = spec["checkpoint_dir"] or os.path.join(spec["run_dir"], "checkpoints")
os.makedirs(ckpt_dir, exist_ok=True)


def event(kind, **fields):
    line = {"kind": kind, "time": time.time(), "role": args.role, "index": args.index, **fields}
    print("@event " + json.dumps(line), flush=True)


def count_start(name):
    """How many times this role was started in this run (1 = the first)."""
    with open(os.path.join(ckpt_dir, name), "a") as f:
        f.write("x")
    return os.path.getsize(os.path.join(ckpt_dir, name))


def up(endpoint):
    host, port = endpoint.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.2).close()
        return True
    except OSError:
        return False


if args.role in ("ps", "worker"):
    starts = count_start(f"{args.role}-{args.index}.starts")
    if args.role == "ps" and starts > 1:
        time.sleep(knobs.get("ps_ready_delay_s", 0.0))
    host, port = spec["cluster"][args.role][args.index].rsplit(":", 1)
    server = socket.create_server((host, int(port)))
    event("ready", address=f"{host}:{port}")
    while True:
        server.settimeout(1.0)
        with contextlib.suppress(OSError):
            server.accept()[0].close()

if args.role == "evaluator":
    event("ready", address=None)
    done = os.path.join(ckpt_dir, "DONE")
    while not os.path.exists(done):
        time.sleep(0.05)
    final = load(done)
    event("eval", step=final["step"], accuracy=0.9, loss=0.1, final=True,
          checkpoint=final["checkpoint"])
    sys.exit(0)

# the chief
starts = count_start("chief.starts")
total = spec["job"]["train_steps"]
every = spec["job"]["checkpoint_frequency"] or total
saved = [int(n[5:]) for n in os.listdir(ckpt_dir) if n.startswith("ckpt-")]
step = max(saved, default=0)
if starts == knobs.get("hang_chief_start"):
    time.sleep(600)
if step:
    time.sleep(knobs.get("resume_delay_s", 0.0))
while not all(up(e) for e in spec["cluster"]["ps"]):
    time.sleep(0.05)
event("train_start", step=step, workers=len(spec["cluster"]["worker"]),
      resumed_from=f"ckpt-{step}" if step else None)
started = time.time()
event("phase_start", protocol=spec["phases"][0]["protocol"], step=step, phase=0)
while step < total:
    time.sleep(knobs.get("step_s", 0.05))
    if not all(up(e) for e in spec["cluster"]["ps"]):
        event("failure", error="parameter server unreachable", error_kind="ps_unavailable")
        sys.exit(3)
    step += 1
    event("step", step=step, loss=1.0 / step, steps_per_sec=20.0, lr=0.1)
    if step % every == 0 or step == total:
        open(os.path.join(ckpt_dir, f"ckpt-{step}"), "w").close()
        event("checkpoint", step=step, path=f"ckpt-{step}", duration_s=0.01, reason="frequency")
event("phase_end", protocol=spec["phases"][0]["protocol"], step=step, phase=0,
      wall_s=time.time() - started, switch_s=0.0)
event("train_end", step=step, train_time_s=time.time() - started)
with open(os.path.join(ckpt_dir, "DONE.tmp"), "w") as f:
    json.dump({"checkpoint": f"ckpt-{step}", "step": step}, f)
os.replace(os.path.join(ckpt_dir, "DONE.tmp"), os.path.join(ckpt_dir, "DONE"))
sys.exit(0)
