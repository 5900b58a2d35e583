# ttp_lightning: `make run` and `make test` set up .venv on first use.
# Sweeps go on to their tables when some jobs end in exit 4 (ran, but not released as protected: the release
# gate, docs/release-gate.md); any other failure stops them.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock
DATA_ROOT ?= ../shared/data
DOCS_OUT ?= site
ARGS ?=

.PHONY: help install lock run test test-slow sweep sweep-certified sweep-forget-size sweep-test-instances sweep-synthetic-k bench bench-certify bench-attacks bench-gpu bench-protection bench-profile docs lint clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 12

# Every package at the version requirements.lock names (pip --constraint); pyproject.toml keeps the ranges.
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --constraint $(LOCK) --upgrade pip
	$(BIN)/pip install --quiet --constraint $(LOCK) torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet --constraint $(LOCK) -e '.[dev,plots,slurm,docs]'
	$(BIN)/pip install --quiet --constraint $(LOCK) --no-deps 'torchattacks>=3.5,<4'  # crosscheck; pyproject.toml
	$(BIN)/python scripts/lock.py check --python $(BIN)/python
	touch $(STAMP)

install: $(STAMP)  ## create .venv with the packages of requirements.lock and the package (editable, dev extras)

lock:  ## refresh requirements.lock: the newest versions pyproject.toml's ranges admit, resolved in a scratch venv
	$(PYTHON) scripts/lock.py write

run: $(STAMP)  ## the default job (digits + MLP + Alg 1); extra overrides via ARGS="..."
	$(BIN)/python -m ttp_lightning $(ARGS)

test: $(STAMP)  ## the test suite without the slow tests, one worker per core (9-10 minutes on 2 cores), its 15 slowest
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow" -q -n auto --dist loadfile --durations=15

docs: $(STAMP)  ## the documentation site (mkdocs --strict: a warning fails it; --quiet would hide them and pass) into DOCS_OUT (default site/); open its index.html
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d $(DOCS_OUT)

test-slow: $(STAMP)  ## only the slow tests (DDP simulation, MNIST paper row)
	$(BIN)/python -m pytest -m slow -q

sweep: $(STAMP)  ## theta sweep of Alg 1 on MNIST MLP (pretrains once), its frontier table and PNGs
	$(BIN)/python -m ttp_lightning -m +experiment=mnist_mlp data.root=$(DATA_ROOT) logger=csv \
		method.theta=0.25,0.5,0.75 hydra.sweep.dir=multirun/sweep_mnist_mlp $(ARGS) || [ $$? -eq 4 ]
	$(BIN)/python -m ttp_lightning.tables multirun/sweep_mnist_mlp --out multirun/sweep_mnist_mlp.md --wandb
	$(BIN)/python -m ttp_lightning.plots multirun/sweep_mnist_mlp --out multirun/sweep_mnist_mlp_png --wandb

sweep-certified: $(STAMP)  ## theta sweep of Alg 2 on MNIST LogReg, mean and CVaR forget terms: table + PNGs
	$(BIN)/python -m ttp_lightning -m +experiment=mnist_logreg_certified data.root=$(DATA_ROOT) logger=csv \
		method.theta=0.125,0.25,0.375,0.5,0.6,0.75,0.85,0.95 method.forget_reduction=mean,cvar \
		hydra.sweep.dir=multirun/sweep_certified $(ARGS) || [ $$? -eq 4 ]
	$(BIN)/python -m ttp_lightning.tables multirun/sweep_certified --layout certified --out multirun/sweep_certified.md
	$(BIN)/python -m ttp_lightning.plots multirun/sweep_certified --out multirun/sweep_certified_png

sweep-forget-size: $(STAMP)  ## forget-set-size ablation (|D_f| 100 ... 5000): Alg 1 MNIST MLP, Alg 2 MNIST LogReg
	$(BIN)/python -m ttp_lightning -m +experiment=mnist_mlp_forget_size data.root=$(DATA_ROOT) logger=csv \
		hydra.sweep.dir=multirun/forget_size/mnist_mlp $(ARGS) || [ $$? -eq 4 ]
	$(BIN)/python -m ttp_lightning -m +experiment=mnist_logreg_certified_forget_size data.root=$(DATA_ROOT) \
		logger=csv hydra.sweep.dir=multirun/forget_size/mnist_logreg $(ARGS) || [ $$? -eq 4 ]
	$(BIN)/python -m ttp_lightning.tables multirun/forget_size --layout forget --out multirun/forget_size.md
	$(BIN)/python -m ttp_lightning.plots multirun/forget_size --out multirun/forget_size_png

sweep-test-instances: $(STAMP)  ## Alg 1 on MNIST MLP with 0, 1/5, 1/2, all of D_f from the test set
	$(BIN)/python -m ttp_lightning -m +experiment=mnist_mlp_test_instances data.root=$(DATA_ROOT) logger=csv \
		hydra.sweep.dir=multirun/test_instances $(ARGS) || [ $$? -eq 4 ]
	$(BIN)/python -m ttp_lightning.tables multirun/test_instances --layout forget --out multirun/test_instances.md

sweep-synthetic-k: $(STAMP)  ## synthetic baseline with k = 5 ... 500 points per forget instance (MNIST MLP)
	$(BIN)/python -m ttp_lightning -m +experiment=mnist_mlp_synthetic_k data.root=$(DATA_ROOT) logger=csv \
		hydra.sweep.dir=multirun/synthetic_k $(ARGS) || [ $$? -eq 4 ]
	$(BIN)/python -m ttp_lightning.tables multirun/synthetic_k --by method.k --out multirun/synthetic_k.md

bench: $(STAMP)  ## wall times and steps/s into bench/bench.json
	$(BIN)/python scripts/bench.py --data-root $(DATA_ROOT) --out bench/bench.json

bench-attacks: $(STAMP)  ## attack evaluation time, findings and torchattacks cross-check into bench/attacks_<method>.json
	$(BIN)/python scripts/bench_attacks.py --data-root $(DATA_ROOT) --method pareto
	$(BIN)/python scripts/bench_attacks.py --data-root $(DATA_ROOT) --method pareto_robust --experiment mnist_mlp_robust

bench-protection: $(STAMP)  ## per-image protection, certified shares, relearning: Alg 1 / robust / retrain into bench/protection.json (~45 min on 2 cores)
	$(BIN)/python scripts/bench_protection.py --data-root $(DATA_ROOT) --out bench/protection.json $(ARGS)

bench-profile: $(STAMP)  ## where robust Alg 1's time goes on mnist_mlp, phase by phase, into bench/profile_mnist_robust.json (~8 min on 2 cores)
	$(BIN)/python scripts/profile_robust.py --out bench/profile_mnist_robust.json -- +experiment=mnist_mlp data.root=$(DATA_ROOT) method=pareto_robust logger=none $(ARGS)

bench-certify: $(STAMP)  ## HVP cost and Alg 3 peak memory into bench/certify_<device>.json
	$(BIN)/python scripts/bench_certify.py

bench-gpu: $(STAMP)  ## GPU images/s, Alg 1 / ERM step, HVP / gradient, cifar100_resnet50 projection into bench/gpu_<device>.json (tiny on CPU)
	$(BIN)/python scripts/bench_gpu.py

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check src tests scripts

clean:  ## remove outputs and caches (keeps .venv)
	rm -rf outputs multirun bench .cache .pytest_cache
