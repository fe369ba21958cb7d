# Everyday commands. Every target wraps `buildtool`; `make help` lists them.
# Settings (environment or make variables): FRAMEWORK, REGISTRY, BASE_MIRROR, VERSION, DOCKER_CLIENT
# (the docker client of every docker command: buildx, classic or a path; see docs/commands.md), JOBS (validate:
# the image tests on this many workers side by side; 1: one after another; PLATFORM: only that platform of an
# image index, e.g. linux/arm64 on a native arm64 GPU runner), TEST_JOBS (make test: the
# toolkit's tests on this many xdist workers; most of their time is waiting on containers, so more
# workers than cores), FAST_JOBS (make test-fast: its workers, twice the cores by default: a fifth of its
# time is tests waiting on subprocesses, sleeps and timeouts; see docs/testing.md).
SHELL := /bin/bash
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
BUILDTOOL := $(PYTHON) -m buildtool
# The default image is pytorch-ngc for build-like targets; plan shows every cell by default.
DEFAULT_IMAGE := pytorch-ngc
TEST_JOBS ?= 4
FAST_JOBS ?= $(shell echo $$(( 2 * $$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) )))
export REGISTRY BASE_MIRROR DOCKER_CLIENT

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

.PHONY: setup
setup: ## Install and start what a fresh machine needs (engine, registry, venv); idempotent
	bash scripts/setup.sh

.PHONY: lock-deps
lock-deps: ## Refresh requirements.lock: exact versions of the toolkit's own dependencies (clean venv)
	UPGRADE=$(UPGRADE) bash scripts/lock-deps.sh

.PHONY: render
render: ## Render dockerfiles/ and docs/images.md from matrix.yaml and templates/
	$(BUILDTOOL) render

.PHONY: check
check: ## Fail with a diff when committed generated files drift from matrix.yaml
	$(BUILDTOOL) check

.PHONY: lock
lock: ## Re-resolve the locks of FRAMEWORK (default all) with uv; PACKAGE=name moves only that package
	$(BUILDTOOL) lock --framework $(or $(FRAMEWORK),all) $(if $(PACKAGE),--package $(PACKAGE))

.PHONY: plan
plan: ## Show what each cell of FRAMEWORK (default: all) will build and how it is tagged
	$(BUILDTOOL) plan --framework $(or $(FRAMEWORK),all)

.PHONY: lint
lint: ## ruff on the code, mypy on buildtool/, hadolint on every rendered Dockerfile
	$(PYTHON) -m ruff check buildtool tests image-tests bench scripts
	$(PYTHON) -m mypy
	find dockerfiles -name Dockerfile -print0 | sort -z | xargs -0 -n1 $(dir $(PYTHON))hadolint --config .hadolint.yaml

.PHONY: test
test: ## The toolkit's own tests (unit and integration), on TEST_JOBS xdist workers; the 30 slowest named (CI's budget)
	$(PYTHON) -m pytest -q -n $(TEST_JOBS) --dist loadgroup --durations=30

# The markers (pyproject.toml) of tests that need more than the toolkit's Python dependencies.
FAST_EXCLUDE := integration or engine or registry or slurm or browser or index or host_torch or tools

.PHONY: test-fast
test-fast: ## The tests that need no engine, registry, SLURM, Chromium, package index, host torch or linter binaries
	$(PYTHON) -m pytest -q -n $(FAST_JOBS) -m "not ($(FAST_EXCLUDE))"

.PHONY: build
build: ## Build FRAMEWORK (default pytorch-ngc; all for every cell) and tag it <name>-dev:<git-sha>-<version>
	$(BUILDTOOL) build --framework $(or $(FRAMEWORK),$(DEFAULT_IMAGE)) $(BUILD_FLAGS)

.PHONY: push
push: ## Build FRAMEWORK if needed and push its dev tags, verifying digests
	$(BUILDTOOL) build --framework $(or $(FRAMEWORK),$(DEFAULT_IMAGE)) --push $(BUILD_FLAGS)

.PHONY: bases
bases: ## Fill the local registry with the bases FRAMEWORK needs (debootstrap Debian, NGC stand-ins)
	$(BUILDTOOL) bases --framework $(or $(FRAMEWORK),$(DEFAULT_IMAGE))

.PHONY: validate
validate: ## Run image-tests against FRAMEWORK's dev images and store verdicts by digest
	$(BUILDTOOL) validate --framework $(or $(FRAMEWORK),$(DEFAULT_IMAGE)) $(if $(JOBS),--jobs $(JOBS)) $(if $(PLATFORM),--platform $(PLATFORM))

# A foreign platform's image validated under QEMU on this machine (CPU checks; a GPU cell's GPU checks are not
# run, so its verdict is incomplete and only a native GPU runner's counts for release); the nightly runs it
# before the native GPU job. pytorch-cuda's arm64 image: see docs/multiplatform.md for its measured time.
.PHONY: validate-emulated
validate-emulated: ## Validate FRAMEWORK's PLATFORM image (default linux/arm64) under QEMU: CPU checks only
	$(BUILDTOOL) validate --framework $(or $(FRAMEWORK),pytorch-cuda) --platform $(or $(PLATFORM),linux/arm64) \
		$(if $(JOBS),--jobs $(JOBS))

.PHONY: keys
keys: ## Make the key pair validating runners sign verdicts with; prints where each half goes (NAME=...)
	$(BUILDTOOL) keys $(if $(NAME),--name $(NAME))

.PHONY: release
release: ## Promote tested dev images of this commit (FROM=<sha>) to release tags: make release VERSION=0.1.0
	@test -n "$(VERSION)" || { echo "error: set VERSION, e.g. make release VERSION=0.1.0" >&2; exit 2; }
	RELEASE_REGISTRY="$(RELEASE_REGISTRY)" $(BUILDTOOL) release --version "$(VERSION)" \
		--framework $(or $(FRAMEWORK),all) $(if $(FROM),--from $(FROM)) $(RELEASE_FLAGS)

.PHONY: verify
verify: ## Verify an image's signed chain (provenance, SBOM, verdict): make verify IMAGE=<registry>/<name>:<tag>
	@test -n "$(IMAGE)" || { echo "error: set IMAGE, e.g. make verify IMAGE=127.0.0.1:5000/pytorch-cpu:2.13" >&2; exit 2; }
	$(BUILDTOOL) verify "$(IMAGE)" $(VERIFY_FLAGS)

# The nightly, as the GPU runners run it (.github/workflows/nightly.yml, one cell per runner there):
# build + push every cell, validate (verdicts stored by digest), the scaling runs (strategies side by side), then the report
# from the registry's verdicts with the trend against the previous run, all under NIGHTLY_OUT.
# NGC bases come from the local stand-ins unless BASE_MIRROR is set (set it empty to pull upstream).
NIGHTLY_OUT ?= reports/nightly
NIGHTLY_SCALING_CELL ?= pytorch-cpu:2.13
NIGHTLY_SCALING_COUNTS ?= 1,2
# The strategies compared side by side (docs/scaling.md): PyTorch's in NIGHTLY_SCALING_CELL (and over SLURM),
# JAX data parallelism in NIGHTLY_JAX_SCALING_CELL (empty: not run).
NIGHTLY_SCALING_STRATEGIES ?= ddp,fsdp,deepspeed
NIGHTLY_JAX_SCALING_CELL ?= jax-cpu:0.10
# On a SLURM site, the scaling also runs over SLURM nodes: set NIGHTLY_SLURM_BUNDLE to a folder on the shared
# file system; the nightly makes it a bundle of NIGHTLY_SCALING_CELL's fresh dev image (replacing the last
# night's) and runs one job per node count in NIGHTLY_SLURM_NODES (SLURM's own containers, --runtime oci).
# NIGHTLY_SLURM_FLAGS passes more, e.g. --partition gpu --gpus-per-node 8 --time 00:30:00.
NIGHTLY_SLURM_BUNDLE ?=
NIGHTLY_SLURM_NODES ?= 1,2
NIGHTLY_SLURM_FLAGS ?=
NIGHTLY_MIRROR := $(if $(filter environment command% override,$(origin BASE_MIRROR)),$(BASE_MIRROR),$(or \
	$(REGISTRY),127.0.0.1:5000))

.PHONY: nightly
nightly: ## Build, validate, scaling run (and over SLURM nodes with NIGHTLY_SLURM_BUNDLE), HTML report into NIGHTLY_OUT
	@out="$(NIGHTLY_OUT)"; status=0; export BASE_MIRROR="$(NIGHTLY_MIRROR)"; \
	$(BUILDTOOL) build --framework $(or $(FRAMEWORK),all) --push || status=1; \
	$(BUILDTOOL) validate $(if $(FRAMEWORK),--framework $(FRAMEWORK),--all) --reports "$$out/validate" || status=1; \
	$(BUILDTOOL) scaling --cell $(NIGHTLY_SCALING_CELL) --counts $(NIGHTLY_SCALING_COUNTS) --out "$$out/scaling" \
		--strategy $(NIGHTLY_SCALING_STRATEGIES) || status=1; \
	$(if $(NIGHTLY_JAX_SCALING_CELL),$(BUILDTOOL) scaling --cell $(NIGHTLY_JAX_SCALING_CELL) --strategy jax-dp \
		--counts $(NIGHTLY_SCALING_COUNTS) --out "$$out/scaling-jax" || status=1;) \
	$(if $(NIGHTLY_SLURM_BUNDLE),image=$$($(BUILDTOOL) plan --framework $(NIGHTLY_SCALING_CELL) --json \
		| $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["include"][0]["dev_image"])') \
		&& $(BUILDTOOL) bundle "$$image" "$(NIGHTLY_SLURM_BUNDLE)" --force \
		&& $(BUILDTOOL) scaling --launcher slurm --runtime oci --image "$(NIGHTLY_SLURM_BUNDLE)" \
			--strategy $(NIGHTLY_SCALING_STRATEGIES) --nodes $(NIGHTLY_SLURM_NODES) $(NIGHTLY_SLURM_FLAGS) --metrics-dir "$$out/scaling-slurm" || status=1;) \
	rm -rf "$$out/previous-verdicts"; if [ -d "$$out/verdicts" ]; then mv "$$out/verdicts" "$$out/previous-verdicts"; fi; \
	$(BUILDTOOL) report --fetch --framework $(or $(FRAMEWORK),all) --verdicts "$$out/verdicts" \
		--previous "$$out/previous-verdicts" --scaling "$$out/scaling" \
		$(if $(NIGHTLY_JAX_SCALING_CELL),--scaling "$$out/scaling-jax") \
		$(if $(NIGHTLY_SLURM_BUNDLE),--scaling "$$out/scaling-slurm") --out "$$out" || status=1; \
	echo "nightly report: $$out/report.html (exit $$status)"; exit $$status

# The GPU paths in one short run (NCCL DDP, bus bandwidth, the profiler's Kernel view, /dev/shm),
# one JSON under GPU_SMOKE_OUT. With an engine that has GPUs: in GPU_SMOKE_IMAGE (default: this
# commit's pytorch-cuda dev image). Without an engine: GPU_SMOKE_PYTHON=/path/to/python (CUDA torch
# and TensorBoard; torch-tb-profiler comes from bench/wheels, see gpu-smoke-wheels). No GPU: "not run".
# The image is pulled first, under its own bound (GPU_SMOKE_PULL_S); the checks then have GPU_SMOKE_DEADLINE_S.
# The script stops itself 20 s after each bound and writes the JSON (SIGTERM too); the outer timeout is a backstop.
GPU_SMOKE_OUT ?= reports/gpu-smoke.json
GPU_SMOKE_WHEELS ?= bench/wheels
GPU_SMOKE_PULL_S ?= 900
GPU_SMOKE_DEADLINE_S ?= 450

.PHONY: gpu-smoke
gpu-smoke: ## GPU paths in < 8 min after the pull into GPU_SMOKE_OUT (GPU_SMOKE_IMAGE=... or GPU_SMOKE_PYTHON=...)
	@if [ -n "$(GPU_SMOKE_PYTHON)" ]; then where=(--python "$(GPU_SMOKE_PYTHON)" --wheels "$(GPU_SMOKE_WHEELS)"); \
	else image="$(GPU_SMOKE_IMAGE)"; if [ -z "$$image" ]; then image=$$($(BUILDTOOL) plan --framework pytorch-cuda \
		--json | $(PYTHON) -c 'import json,sys; print(json.load(sys.stdin)["include"][0]["dev_image"])') || exit 2; fi; \
	where=(--image "$$image"); fi; \
	timeout -k 15 $$(( $(GPU_SMOKE_PULL_S) + $(GPU_SMOKE_DEADLINE_S) + 90 )) $(PYTHON) scripts/gpu_smoke.py \
		"$${where[@]}" --out "$(GPU_SMOKE_OUT)" --pull-timeout $(GPU_SMOKE_PULL_S) --deadline $(GPU_SMOKE_DEADLINE_S)

.PHONY: gpu-smoke-wheels
gpu-smoke-wheels: ## Download torch-tb-profiler (a wheel) into GPU_SMOKE_WHEELS for gpu-smoke on a machine without an index
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --dest "$(GPU_SMOKE_WHEELS)" torch-tb-profiler==0.4.3
