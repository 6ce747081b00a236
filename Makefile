# Quick start: `make demo` (plan and compare on a built-in model) and `make test`.
# Each target sets up its own virtual environment (.venv) from requirements.lock.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BROWSER := $(VENV)/.browser
OUT := out

.PHONY: demo test bench install clean

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# The HTML report's test opens the page in headless Chromium: Debian's, installed once where
# apt-get runs as root; elsewhere that one test skips, saying why.
$(BROWSER): $(STAMP)
	@command -v chromium >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 || \
	    { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	      echo "make: installing Debian's chromium for the report's browser test" && \
	      apt-get install -y -q chromium >/dev/null 2>&1; } || \
	    echo "make: no headless Chromium here: tests/test_report_html.py's browser test will skip"
	@touch $@

demo: $(STAMP)
	$(BIN)/pipeplan compare --model zoo:bert-large --cluster spp-sim --microbatches 32 --out $(OUT)/demo-plan.json
	$(BIN)/pipeplan simulate $(OUT)/demo-plan.json --trace $(OUT)/demo-trace.json --gantt $(OUT)/demo-plan-gantt.png

# one BLAS and OpenMP thread a test worker: two workers share two cores without their idle
# threads spinning against each other (torch's own thread count is set where a test needs one)
test: $(STAMP) $(BROWSER)
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist worksteal

bench: $(STAMP)
	$(BIN)/python benchmarks/sim_throughput.py --json
	$(BIN)/python benchmarks/memory_accuracy.py
	$(BIN)/python benchmarks/pipedream_speed.py
	$(BIN)/python benchmarks/baselines_compare.py
	$(BIN)/python benchmarks/spp/table3.py
	$(BIN)/python benchmarks/spp/sweeps.py
	$(BIN)/python benchmarks/spp/gap.py
	$(BIN)/python benchmarks/spp/speed.py
	$(BIN)/python benchmarks/joint/gap.py
	$(BIN)/python benchmarks/joint/optimality.py
	$(BIN)/python benchmarks/joint/never_slower.py
	$(BIN)/python benchmarks/joint/speed.py
	$(BIN)/python benchmarks/resalloc/figures.py
	$(BIN)/python benchmarks/resalloc/grouping_scale.py
	$(BIN)/python benchmarks/runtime/accuracy.py
	$(BIN)/python benchmarks/runtime/hf_flow.py
	$(BIN)/python benchmarks/runtime/every_plan.py
	$(BIN)/python benchmarks/schedules/gains.py --runs 5
	$(BIN)/python benchmarks/drlpp/table1.py --budget 120
	$(BIN)/python benchmarks/drlpp/evaluate.py
	$(BIN)/python benchmarks/drlpp/measured.py
	$(BIN)/python benchmarks/drlpp/env_speed.py
	$(BIN)/python benchmarks/automap/table7.py --budget 300
	$(BIN)/python benchmarks/automap/enumeration.py
	$(BIN)/python benchmarks/automap/infer.py
	$(BIN)/python benchmarks/automap/infer_latency.py
	$(BIN)/python benchmarks/learning/heldout.py --agents automap-infer
	$(BIN)/python benchmarks/learning/heldout.py --agents drl-pp
	$(BIN)/python benchmarks/learning/apart.py --agents automap-infer
	$(BIN)/python benchmarks/learning/apart.py --agents drl-pp
	$(BIN)/python benchmarks/learning/collapse.py
	$(BIN)/python benchmarks/automap/large.py
	$(BIN)/python benchmarks/automap/wide_data.py
	$(BIN)/python benchmarks/learning_mutations.py
	$(BIN)/python benchmarks/automap/shard.py --set t5
	$(BIN)/python benchmarks/automap/shard.py --set vgg
	$(BIN)/python benchmarks/dynpartition/figures.py
	$(BIN)/python benchmarks/dynpartition/learning.py
	$(BIN)/python benchmarks/dynpartition/stream.py
	$(BIN)/python benchmarks/gpu/gemm_efficiency.py
	$(BIN)/python benchmarks/gpu/layer_timing.py --if-gpu
	$(BIN)/python benchmarks/gpu/run_accuracy.py
	$(BIN)/python benchmarks/published/calibrate.py
	$(BIN)/python benchmarks/published/megatron_sc21.py
	$(BIN)/python benchmarks/published/validation.py
	$(BIN)/python benchmarks/published/validation_5d.py
	$(BIN)/python benchmarks/llm/scale.py
	$(BIN)/python benchmarks/llm_mutations.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .hypothesis
