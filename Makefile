# Paper figures and the sweeps behind them (CPU only, minutes). The checkout's .venv is used when it exists (no need
# to activate it); otherwise python3 from PATH; PYTHON=... overrides both.
ROOT := $(dir $(abspath $(lastword $(MAKEFILE_LIST))))
PYTHON ?= $(if $(wildcard $(ROOT).venv/bin/python),$(ROOT).venv/bin/python,python3)
RESULTS ?= results
FIGURES ?= $(RESULTS)/figures

.PHONY: figs figs-only sweeps test-experiments

figs:  ## run the sweeps that are missing (finished configs are skipped), then draw every figure
	$(PYTHON) -m paper_figs all --results $(RESULTS) --out $(FIGURES)

figs-only:  ## draw from the results tables as they are
	$(PYTHON) -m paper_figs all --no-run --results $(RESULTS) --out $(FIGURES)

sweeps:  ## the sweeps alone
	$(PYTHON) -m experiments.replay -m experiment=miss_rate results.dir=$(RESULTS)
	$(PYTHON) -m experiments.predict -m experiment=throughput results.dir=$(RESULTS)
	$(PYTHON) -m experiments.predict -m experiment=hybrid_split results.dir=$(RESULTS)
	$(PYTHON) -m experiments.predict -m experiment=turn_latency results.dir=$(RESULTS)
	$(PYTHON) -m experiments.live -m experiment=sim_vs_live results.dir=$(RESULTS)

test-experiments:
	$(PYTHON) -m pytest tests/test_conf.py tests/test_experiments.py tests/test_figs.py
