"""Device grouping (Duan & Wu §V, Alg. 2) at scale and against brute force.

1. Time of Alg. 2 (and of its optional move/swap pass, and of §VI's sorting baseline) on
   1,000 devices into q in {4, 16, 64} workers, with each one's bottleneck cost.
2. Ratio of the bottleneck cost to the optimum (brute force) on random sets of 4..10
   devices, q in {2, 3, 4}: median, mean and worst, for the exact device kinds and with
   +-20% jitter per device and resource.

Devices are drawn from grouping.EXAMPLE_DEVICE_KINDS (§VI's three kinds: laptop i7+GTX1650,
laptop i5+Iris Xe, Raspberry Pi 4B: pipeplan's device kinds, from vendor peak figures) with
the reference workload EXAMPLE_WORKLOAD (AlexNet). Writes benchmarks/results/resalloc/grouping.{json,md}.

    python benchmarks/resalloc/grouping_scale.py [--sets N] [--seed S] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pipeplan.planners.resalloc.grouping import (EXAMPLE_DEVICE_KINDS, EXAMPLE_WORKLOAD, brute_force_groups,
                                                 groups_cost, local_search_groups, sorting_groups)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_results.py
from _results import add_out_argument, write_json, write_markdown  # noqa: E402

KINDS = np.array(list(EXAMPLE_DEVICE_KINDS.values()))
WF, WG = (np.array(w) for w in EXAMPLE_WORKLOAD)
METHODS = {
    "local": lambda r, q: local_search_groups(r, q, WF, WG),
    "local+improve": lambda r, q: local_search_groups(r, q, WF, WG, improve=True),
    "sorting": lambda r, q: sorting_groups(r, q, WF, WG),
}


def devices(rng: np.random.Generator, n: int, jitter: float) -> np.ndarray:
    return KINDS[rng.integers(0, len(KINDS), n)] * rng.uniform(1 - jitter, 1 + jitter, (n, KINDS.shape[1]))


def scale(rng: np.random.Generator) -> list[dict]:
    rows = []
    rates = devices(rng, 1000, 0.2)
    for q in (4, 16, 64):
        row: dict = {"devices": 1000, "q": q}
        for name, fn in METHODS.items():
            start = time.perf_counter()
            groups = fn(rates, q)
            row[f"{name}_s"] = time.perf_counter() - start
            row[f"{name}_cost"] = groups_cost(rates, groups, WF, WG)
        rows.append(row)
        print(row)
    return rows


def ratios(rng: np.random.Generator, sets: int) -> list[dict]:
    rows = []
    for jitter in (0.0, 0.2):
        for q in (2, 3, 4):
            found: dict[str, list[float]] = {name: [] for name in METHODS}
            bf_time = 0.0
            for _ in range(sets):
                rates = devices(rng, int(rng.integers(q, 11)), jitter)
                start = time.perf_counter()
                best = groups_cost(rates, brute_force_groups(rates, q, WF, WG), WF, WG)
                bf_time = max(bf_time, time.perf_counter() - start)
                for name, fn in METHODS.items():
                    found[name].append(groups_cost(rates, fn(rates, q), WF, WG) / best)
            row: dict = {"jitter": jitter, "q": q, "sets": sets, "brute_force_worst_s": bf_time}
            for name, vals in found.items():
                v = np.array(vals)
                row[name] = {"median": float(np.median(v)), "mean": float(v.mean()), "worst": float(v.max()),
                             "optimal_share": float(np.mean(v <= 1 + 1e-9))}
            rows.append(row)
            print({k: row[k] for k in ("jitter", "q")}, {n: row[n] for n in METHODS})
    return rows


def markdown(args: argparse.Namespace, scale_rows: list[dict], ratio_rows: list[dict]) -> str:
    out = ["# Device grouping (Alg. 2): scale and gap to brute force", "",
           f"{args.sets} random sets per (jitter, q), seed {args.seed}.", "",
           "Device kinds from pipeplan's kinds (vendor peak figures; grouping.EXAMPLE_DEVICE_KINDS), "
           "reference workload AlexNet (grouping.EXAMPLE_WORKLOAD); cost = bottleneck worker's optimal max(F, G).", "",
           "## 1,000 devices (+-20% jitter)", "",
           "| q | Alg. 2 (s) | Alg. 2 cost | + improve (s) | + improve cost | sorting (s) | sorting cost |",
           "|---|---|---|---|---|---|---|"]
    for r in scale_rows:
        out.append(f"| {r['q']} | {r['local_s']:.3f} | {r['local_cost']:.4g} | {r['local+improve_s']:.3f} | "
                   f"{r['local+improve_cost']:.4g} | {r['sorting_s']:.3f} | {r['sorting_cost']:.4g} |")
    out += ["", "## Cost / optimum on random sets of q..10 devices", "",
            "| jitter | q | sets | Alg. 2 median | Alg. 2 worst | Alg. 2 optimal | + improve median | "
            "+ improve worst | sorting median | sorting worst |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ratio_rows:
        a, b, c = r["local"], r["local+improve"], r["sorting"]
        out.append(f"| {r['jitter']:.0%} | {r['q']} | {r['sets']} | {a['median']:.4f} | {a['worst']:.4f} | "
                   f"{a['optimal_share']:.0%} | {b['median']:.4f} | {b['worst']:.4f} | {c['median']:.4f} | "
                   f"{c['worst']:.4f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2024)
    add_out_argument(ap, "resalloc")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    scale_rows = scale(rng)
    ratio_rows = ratios(rng, args.sets)
    payload = {"seed": args.seed, "sets": args.sets, "device_kinds": EXAMPLE_DEVICE_KINDS,
               "workload": {"wf": WF.tolist(), "wg": WG.tolist()}, "rates_source": "cluster/kinds.py (vendor peak figures)",
               "scale": scale_rows, "ratios": ratio_rows}
    json_path = write_json(args.out / "grouping.json", payload)
    md_path = write_markdown(args.out / "grouping.md", markdown(args, scale_rows, ratio_rows))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
