"""The README's Hugging Face flow, command by command, as a check: profile a GPT-2 built from a
config, calibrate 3 workers with its training step, plan with SPP held to 2 stages (uneven
replication), run with --check and the measured-vs-predicted Gantt chart. Exits 1 unless the
plan is uneven, the check passes and the chart is written. Writes
benchmarks/results/runtime/hf_flow.json (accuracy_worst.png shows such a chart).

    python benchmarks/runtime/hf_flow.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json  # noqa: E402

SPEC = "hf:gpt2?n_layer=4&n_embd=128"


def pipeplan(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeplan", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(ap, "runtime")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        steps = [("profile", SPEC, "--out", "g.json"),
                 ("calibrate", "--workers", "3", "--model", SPEC, "--out", "c.yaml"),
                 ("plan", "--model", "g.json", "--cluster", "c.yaml", "--microbatches", "4", "--planner", "spp",
                  "-O", "stages=2", "--out", "p.json"),
                 ("run", "p.json", "--model", SPEC, "--check", "--gantt", "measured.png", "--vs-prediction",
                  "--json")]
        for argv in steps:
            proc = pipeplan(*argv, cwd=work)
            print(f"pipeplan {' '.join(argv)}: exit {proc.returncode}", flush=True)
            if proc.returncode != 0 and argv[0] != "run":
                print(proc.stderr, file=sys.stderr)
                return 1
        run = json.loads(proc.stdout)
        plan = json.loads((work / "p.json").read_text())
        devices = [len(s["devices"]) for s in plan["stages"]]
        checks = {"uneven_plan": len(set(devices)) > 1, "check_passes": run["check"]["verdict"] == "pass",
                  "exit_code": proc.returncode, "gantt_written": (work / "measured.png").is_file()}
    ok = checks["uneven_plan"] and checks["check_passes"] and checks["exit_code"] == 0 and checks["gantt_written"]
    write_json(args.out / "hf_flow.json", {"checks": checks, "ok": ok, "devices_per_stage": devices,
                                           "measured_s": run["measured_s"], "predicted_s": run["predicted_s"],
                                           "check": run["check"], "action_error": run["action_error"]["summary"]})
    print(f"devices per stage {devices}; check {run['check']['verdict']}; measured {run['measured_s'] * 1e3:.1f} ms, "
          f"predicted {run['predicted_s'] * 1e3:.1f} ms; {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
