"""Would the quick tests notice a broken learning planner? Each mutation below is applied to a
copy of the source, then the learning planners' quick tests (``pytest -m "not slow"`` on
their files) run against that copy; a mutation survives when they all pass. Exits 1 if any
survives. The mutations:

- ``no clip``: PPO's objective without its clip (``ratio * adv``);
- ``min -> max``: the pessimistic bound of PPO's objective turned optimistic;
- ``advantage sign``: DRL-PP's advantages as baseline minus reward;
- ``reward sign``: the scorer's reward ``+ln(iteration)`` instead of ``-ln``;
- ``random checkpoint``: the shipped Auto-MAP checkpoint replaced by random weights of the
  same network (a valid checkpoint that learned nothing).

    python benchmarks/learning_mutations.py [--out DIR]

Writes benchmarks/results/learning/mutations.json (per mutation: caught, the failing tests).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import ROOT, add_out_argument, write_json  # noqa: E402

TESTS = ["tests/test_learning_guards.py", "tests/test_drlpp.py", "tests/test_automap_infer.py",
         "tests/test_learn_env.py", "tests/test_learn_search.py", "tests/test_drlpp_cli.py"]
PPO = "pipeplan/planners/drlpp/ppo.py"
#: name -> (file under src/, the text replaced, its replacement)
EDITS = {
    "no clip": (PPO, "-torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()",
                "-(ratio * adv).mean()"),
    "min -> max": (PPO, "-torch.min(ratio * adv,", "-torch.max(ratio * adv,"),
    "advantage sign": (PPO, "adv_s = np.array([s.reward for s in schemes]) - baseline\n"
                            "    adv_p = np.concatenate([np.array(s.rewards) for s in schemes]) - baseline",
                       "adv_s = baseline - np.array([s.reward for s in schemes])\n"
                       "    adv_p = baseline - np.concatenate([np.array(s.rewards) for s in schemes])"),
    "reward sign": ("pipeplan/learn/scoring.py", "r = -np.log(res.iteration_s)", "r = np.log(res.iteration_s)"),
}


def _random_checkpoint(src: Path) -> None:
    """The shipped checkpoint's file replaced by random weights in the same format."""
    sys.path.insert(0, str(src))
    import torch

    from pipeplan.learn.dqn import q_network
    from pipeplan.learn.harness import checkpoint
    from pipeplan.planners.automap.infer import AGENT, POINTS, SHIPPED, InferEnv, config

    torch.manual_seed(0)
    cfg = config()
    state = {k: v.half() for k, v in q_network(InferEnv.OBS, POINTS, cfg).state_dict().items()}
    assert SHIPPED.is_relative_to(src), "the source copy must be the one imported"
    torch.save(checkpoint(AGENT, cfg, state, {"data": "random weights (a mutation)"}), SHIPPED)
    sys.path.remove(str(src))


def mutate(name: str, src: Path) -> None:
    if name == "random checkpoint":
        _random_checkpoint(src)
        return
    rel, old, new = EDITS[name]
    path = src / rel
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"mutation {name!r}: {old!r} is no longer in {rel}: update benchmarks/learning_mutations.py")
    path.write_text(text.replace(old, new, 1))


def run_tests(src: Path) -> tuple[bool, list[str]]:
    """(every quick test passed, the failing tests) against the source copy ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
                           "-x", *TESTS], cwd=ROOT, env=env, capture_output=True, text=True)
    failed = re.findall(r"^FAILED (\S+)", done.stdout, re.M)
    return done.returncode == 0, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser, "learning")
    args = parser.parse_args()
    rows = {}
    passed, failed = run_tests(ROOT / "src")
    if not passed:  # the control: unmutated, the tests pass
        raise SystemExit(f"the learning tests fail without a mutation: {', '.join(failed)}")
    for name in [*EDITS, "random checkpoint"]:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "src"
            shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
            mutate(name, src)
            passed, failed = run_tests(src)
        rows[name] = {"caught": not passed, "failing": failed}
        print(f"{name:<18} {'caught by ' + ', '.join(failed) if not passed else 'SURVIVES'}", flush=True)
    write_json(args.out / "mutations.json", {"tests": TESTS, "mutations": rows})
    if not all(r["caught"] for r in rows.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
