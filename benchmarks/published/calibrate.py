"""Fit the share of the kernel-level compute rate a training run keeps end to end
(``llm/costs.py``: ``END_TO_END``), the one constant calibrated on published end-to-end
throughput, on Megatron-LM SC'21 Table 1 (``megatron_sc21.yaml``): the value that minimizes
the summed squared log error of predicted against published TFLOP/s per GPU over the rows,
every other constant as it is (the GPUs' GEMM efficiency and overhead, NCCL's efficiency):

    .venv/bin/python benchmarks/published/calibrate.py

Prints the fitted value and each row's error at it, and writes
benchmarks/results/published/calibration.json. ``megatron_sc21.py`` then reports the errors at
the constant in ``llm/costs.py`` without fitting anything.
"""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import contextmanager
from pathlib import Path

from scipy.optimize import minimize_scalar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import add_out_argument, write_json  # noqa: E402
from _runs import load_rows, predict  # noqa: E402

from pipeplan.planners import llm3d  # noqa: E402
from pipeplan.llm import costs as llm_costs  # noqa: E402


@contextmanager
def end_to_end(value: float):
    """``llm_costs.END_TO_END`` = ``value`` inside the block."""
    saved = llm_costs.END_TO_END
    try:
        llm_costs.END_TO_END = value
        llm3d._per_microbatch.cache_clear()
        yield
    finally:
        llm_costs.END_TO_END = saved
        llm3d._per_microbatch.cache_clear()


def log_errors(head: dict, rows: list, value: float) -> list[float]:
    with end_to_end(value):
        return [math.log(predict(head, r).extra["hw_tflops_per_gpu"] / r.tflops_per_gpu) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_out_argument(parser, "published")
    args = parser.parse_args()
    head, rows = load_rows()
    fit = minimize_scalar(lambda v: sum(e * e for e in log_errors(head, rows, v)), bounds=(0.5, 1.0),
                          method="bounded", options={"xatol": 1e-4})
    value = round(float(fit.x), 3)
    errors = log_errors(head, rows, value)
    print(f"end-to-end share of the kernel rate fitted on {len(rows)} rows: {value:.3f} "
          f"(llm/costs.py has {llm_costs.END_TO_END:.3f})")
    for r, e in zip(rows, errors):
        print(f"  {r.name:>7}  published {r.tflops_per_gpu:5.0f}  predicted {r.tflops_per_gpu * math.exp(e):6.1f} "
              f"TFLOP/s per GPU  error {math.expm1(e):+.1%}")
    write_json(args.out / "calibration.json", {
        "source": head["source"], "constant": "END_TO_END (llm/costs.py)",
        "fitted": value, "in_code": llm_costs.END_TO_END, "objective": "sum of squared log(predicted / published)",
        "rows": [{"model": r.name, "published": r.tflops_per_gpu, "error": math.expm1(e)} for r, e in zip(rows, errors)]})


if __name__ == "__main__":
    main()
