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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mutations import apply, run_all  # noqa: E402
from _results import add_out_argument, write_json  # noqa: E402

TESTS = ["tests/test_learning_guards.py", "tests/test_drlpp.py", "tests/test_automap_infer.py",
         "tests/test_learn_env.py", "tests/test_learn_search.py", "tests/test_drlpp_cli.py"]
PPO = "pipeplan/planners/drlpp/ppo.py"
#: name -> (file under src/, the text replaced, its replacement)
EDITS = {
    "no clip": (PPO, "-torch.min(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv).mean()",
                "-(ratio * adv).mean()"),
    "min -> max": (PPO, "-torch.min(ratio * adv,", "-torch.max(ratio * adv,"),
    "advantage sign": (PPO, "return (np.where(valid_s, d_s * scale, INVALID_ADVANTAGE), "
                            "np.where(valid_p, d_p * scale, INVALID_ADVANTAGE))",
                       "return (np.where(valid_s, -d_s * scale, INVALID_ADVANTAGE), "
                       "np.where(valid_p, -d_p * scale, INVALID_ADVANTAGE))"),
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
    apply(EDITS, name, src, "benchmarks/learning_mutations.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(parser, "learning")
    args = parser.parse_args()
    rows = run_all([*EDITS, "random checkpoint"], mutate, TESTS, "learning", 18)
    write_json(args.out / "mutations.json", {"tests": TESTS, "mutations": rows})
    if not all(r["caught"] for r in rows.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
