"""GitHub Actions workflows, generated from the matrix (committed, drift-checked like the Dockerfiles).

Three workflows:
- pull request: drift check, lint, the toolkit's tests, and build + validate of the cells that need no GPU;
- nightly on self-hosted GPU runners: build and validate every cell, push verdicts, scaling run, report;
  each platform of a GPU cell is validated on GPU runners of that architecture (one job per cell and
  platform: linux/amd64 in the build job, linux/arm64 on the GH200 runners, so an arm64-only GPU cell is
  validated there alone), each other platform of a CPU cell under emulation on the amd64 runners;
- release: the release pipeline for one version, on manual dispatch.

The job matrices come from `buildtool plan --json` at run time (a `plan` job, `fromJSON` in the
consumers), so dev tags carry the commit being built; which cells a workflow covers is decided here
from the matrix and written into the file, so adding a cell changes the committed workflow and
`buildtool check` notices. Output is a pure function of the matrix: byte-identical on every machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from buildtool.common import yamlout
from buildtool.contracts import platforms
from buildtool.contracts.releases import RELEASES_DIR
from buildtool.matrix.schema import Matrix
from buildtool.render.catalogue import CATALOGUE_PATH

WORKFLOW_DIR = ".github/workflows"
PR_PATH = f"{WORKFLOW_DIR}/pull-request.yml"
NIGHTLY_PATH = f"{WORKFLOW_DIR}/nightly.yml"
RELEASE_PATH = f"{WORKFLOW_DIR}/release.yml"

# Runner labels of the self-hosted GPU runners; a repository variable overrides them without
# regenerating (Settings > Variables: GPU_RUNNER_LABELS='["self-hosted","linux","gpu","a100"]').
DEFAULT_GPU_LABELS = ("self-hosted", "linux", "x64", "gpu")
# The GPU runners of each other platform (its architecture as GitHub's runner label, and the machine),
# overridden by the variable GPU_RUNNER_LABELS_<ARCH> (e.g. GPU_RUNNER_LABELS_ARM64). GPU tests of a
# platform count only from a native runner of it: an emulated GPU run is not a GPU run.
NATIVE_GPU_LABELS: dict[str, tuple[str, ...]] = {
    "linux/arm64": ("self-hosted", "linux", "arm64", "gpu", "gh200"),
}
DEFAULT_RELEASE_LABELS = ("self-hosted", "linux", "x64")  # override: variable RELEASE_RUNNER_LABELS
HOSTED_RUNNER = "ubuntu-24.04"
PYTHON = "3.11"
# Each action pinned by its full commit, with the release tag that commit is (read in the action's repository): a tag
# can be moved to other code, and that code would run in the jobs that hold the signing keys. Each file's header names
# the tags of the commits it uses.
ACTION_PINS: dict[str, tuple[str, str]] = {
    "actions/checkout": ("11d5960a326750d5838078e36cf38b85af677262", "v4.4.0"),
    "actions/setup-python": ("a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),
    "actions/upload-artifact": ("ea165f8d65b6e75b540449e92b4886f43607fa02", "v4.6.2"),
    "actions/download-artifact": ("d3f86a106a0bac45b974a628896c90dbdf5c8093", "v4.3.0"),
    "actions/cache": ("0057852bfaa89a56745cba8c7296529d2fc39830", "v4.3.0"),
    "actions/upload-pages-artifact": ("56afc609e74202658d3ffba0e8f6dda462b719fa", "v3.0.1"),
    "actions/deploy-pages": ("d6db90164ac5ed86f2b6aed7e0febac5b3c0c03e", "v4.0.5"),
}


def _action(repo: str, path: str = "") -> str:
    """`uses:` of REPO's action (at PATH inside it) at its pinned commit."""
    return f"{repo}{path}@{ACTION_PINS[repo][0]}"


CHECKOUT = _action("actions/checkout")
SETUP_PYTHON = _action("actions/setup-python")
UPLOAD = _action("actions/upload-artifact")
DOWNLOAD = _action("actions/download-artifact")
CACHE_RESTORE = _action("actions/cache", "/restore")
CACHE_SAVE = _action("actions/cache", "/save")
PAGES_UPLOAD = _action("actions/upload-pages-artifact")
PAGES_DEPLOY = _action("actions/deploy-pages")

# Every file a workflow writes in the checkout goes under reports/, which .gitignore ignores: an untracked file makes
# the work tree's revision `<sha>-dirty.<hash>` (matrix.plan.git_revision), and validate, the report and release
# would then look for dev images of a revision nothing pushed.
WRITES = "reports"
PLAN_FILE = f"{WRITES}/plan.json"
RELEASE_PLAN_FILE = f"{WRITES}/release-plan.json"

HEADER = ("# GENERATED FILE - DO NOT EDIT. Rendered from matrix.yaml by `buildtool workflows` "
          "(also `make render`);\n# `make check` fails when it drifts.\n")


@dataclass(frozen=True)
class WorkflowOptions:
    """What a site may change when generating (the committed files use the defaults)."""

    gpu_labels: tuple[str, ...] = DEFAULT_GPU_LABELS      # linux/amd64's GPU runners (build and validate)
    # Each other platform's GPU runners: (platform, labels); a platform a GPU cell has needs an entry.
    platform_gpu_labels: tuple[tuple[str, tuple[str, ...]], ...] = tuple(NATIVE_GPU_LABELS.items())
    nightly_cron: str = "17 2 * * *"
    scaling_counts: str = "gpus"     # 1, 2, 4, ... up to each runner's GPU count (`buildtool scaling --counts`)


def dump_workflow(doc: dict[str, Any], cells_note: str) -> bytes:
    return (HEADER + cells_note + _pins_note(doc) + yamlout.dump(doc)).encode()


def _pins_note(doc: dict[str, Any]) -> str:
    """A comment naming the release tag of each pinned action commit DOC uses."""
    used = {"/".join(step["uses"].split("@", 1)[0].split("/")[:2])   # owner/repo of owner/repo[/path]@ref
            for job in doc["jobs"].values() for step in job.get("steps", []) if "uses" in step}
    pins = [f"{repo} {tag}" for repo, (_, tag) in ACTION_PINS.items() if repo in used]
    return f"# Actions pinned by commit: {', '.join(pins)}\n" if pins else ""


def _labels_expr(options: WorkflowOptions, platform: str = "linux/amd64") -> str:
    """The runs-on of `platform`'s GPU runners: the repository variable when set, else the default labels."""
    if platform == "linux/amd64":
        return _runs_on("GPU_RUNNER_LABELS", options.gpu_labels)
    found = dict(options.platform_gpu_labels).get(platform)
    if found is None:   # fail closed: a GPU cell of a platform with no runners would never be validated
        raise ValueError(f"no GPU runner labels for {platform}; add them to WorkflowOptions.platform_gpu_labels")
    return _runs_on(f"GPU_RUNNER_LABELS_{platforms.get(platform).architecture.upper()}", found)


def _runs_on(variable: str, labels: tuple[str, ...]) -> str:
    """A runs-on of the repository variable VARIABLE when set, else of LABELS."""
    return "${{ fromJSON(vars." + variable + " || '" + json.dumps(list(labels), separators=(",", ":")) + "') }}"


def native_gpu_cells(matrix: Matrix) -> dict[str, list[str]]:
    """Platform (other than linux/amd64) -> the GPU cells that have it: each validated there on a native GPU
    runner of that platform, one job per (cell, platform). CPU cells' other platforms are validated under
    emulation on the amd64 runners, in the build job."""
    found: dict[str, list[str]] = {}
    for cell in (c for c in matrix.cells if c.needs_gpu):
        for platform in (p for p in cell.platforms if p != "linux/amd64"):
            found.setdefault(platform, []).append(cell.key)
    return found


def _validate_step(matrix: Matrix) -> dict[str, Any]:
    """The build job's validation (on the amd64 GPU runners). A multi-platform GPU cell's GPU tests count only
    natively: here its linux/amd64 manifest, each other platform on that platform's runners (the
    validate-<platform> jobs); a GPU cell without linux/amd64 is not validated here at all (its index has no
    amd64 image); every other cell's every platform is validated here, a CPU cell's foreign ones under emulation
    (PLATFORM empty: every platform of the index)."""
    run, env = _make("nightly-validate", FRAMEWORK="'${{ matrix.cell }}'", **VALIDATE_SETTINGS), SIGNING_ENV
    native = {cell for cells in native_gpu_cells(matrix).values() for cell in cells}
    elsewhere = sorted(c.key for c in matrix.cells if c.needs_gpu and "linux/amd64" not in c.platforms)
    step: dict[str, Any] = {"name": "Validate with GPUs and push the signed verdict"}
    if elsewhere:
        step["if"] = f"${{{{ !contains(fromJSON('{json.dumps(elsewhere, separators=(',', ':'))}'), matrix.cell) }}}}"
    if native - set(elsewhere):
        listed = json.dumps(sorted(native - set(elsewhere)), separators=(",", ":"))
        run += ' PLATFORM="$PLATFORM"'
        env = {**env, "PLATFORM": f"${{{{ contains(fromJSON('{listed}'), matrix.cell) && 'linux/amd64' || '' }}}}"}
    return {**step, "run": run, "env": env}


def _make(target: str, **settings: str) -> str:
    """`make TARGET K=V ...`: a step the Makefile defines, run as `make nightly` runs it (settings only differ)."""
    return " ".join(["make", target, *(f"{key}={value}" for key, value in settings.items())])


HOSTED_SETUP = (
    {"uses": CHECKOUT},
    {"uses": SETUP_PYTHON, "with": {"python-version": PYTHON}},
    {"name": "Install the toolkit", "run": "python -m pip install -e '.[dev]'"},
)
# Self-hosted runners keep their engine and Python; a venv per job keeps runs apart. They keep their work folder
# too: the checkout leaves no GITHUB_TOKEN in .git/config for the next job (no job pushes to git).
SELF_HOSTED_CHECKOUT = {"uses": CHECKOUT, "with": {"persist-credentials": False}}
SELF_HOSTED_SETUP = (
    SELF_HOSTED_CHECKOUT,
    {"name": "Install the toolkit", "run": "python3 -m venv .venv\n.venv/bin/python -m pip install -e '.[dev]'\n"},
)


def _plan_job(cells: list[str]) -> dict[str, Any]:
    """A job whose output `matrix` is `buildtool plan --json` narrowed to `cells`, on one line."""
    return {
        "runs-on": HOSTED_RUNNER,
        "timeout-minutes": 10,
        "outputs": {"matrix": "${{ steps.plan.outputs.matrix }}"},
        "steps": [
            *HOSTED_SETUP,
            {"id": "plan", "name": "Plan the cells",
             "run": (f"mkdir -p {WRITES}\npython -m buildtool plan --json > {PLAN_FILE}\n"
                     f"python -m buildtool workflows ci-matrix --plan {PLAN_FILE} --cells {','.join(cells)} "
                     ">> \"$GITHUB_OUTPUT\"\n")},
            {"uses": UPLOAD, "with": {"name": "plan", "path": PLAN_FILE}},
        ],
    }


def _cells_note(label: str, cells: list[str]) -> str:
    return f"# {label}: {', '.join(cells)}\n"


def pull_request_workflow(matrix: Matrix) -> tuple[dict[str, Any], list[str]]:
    cpu_cells = [c.key for c in matrix.cells if not c.needs_gpu]
    doc: dict[str, Any] = {
        "name": "pull-request",
        "on": {"pull_request": {}, "push": {"branches": ["main"]}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "pr-${{ github.ref }}", "cancel-in-progress": True},
        "jobs": {
            "check": {
                "name": "generated files match matrix.yaml",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 10,
                "steps": [*HOSTED_SETUP,
                          {"name": "Drift check", "run": "make check"},
                          {"name": "Workflow schema",
                           "run": "check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml"}],
            },
            "lint": {
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 10,
                "steps": [*HOSTED_SETUP, {"name": "ruff and hadolint", "run": "make lint"}],
            },
            # The README's test command as the hosted runner's user (runner, not root): setup-tests.sh runs what
            # needs root through its passwordless sudo and fills .venv, which `make test` runs, with the test extras.
            "test": {
                "name": "toolkit tests",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 45,
                "steps": [*HOSTED_SETUP[:2],
                          {"name": "Engine, registry, QEMU, browser, SLURM and the test extras in .venv",
                           "run": "make setup-tests"},
                          {"name": "Tests", "run": "make test"},
                          {"if": "always()", "uses": UPLOAD,
                           "with": {"name": "test-artefacts", "path": "reports/artefacts/",
                                    "if-no-files-found": "ignore"}}],
            },
            "plan": _plan_job(cpu_cells),
            "cpu-image": {
                "name": "build and validate ${{ matrix.cell }}",
                "needs": "plan",
                "runs-on": HOSTED_RUNNER, "timeout-minutes": 60,
                "strategy": {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.matrix) }}"},
                # Bases come from the job's own registry (mmdebstrap Debian), as on a machine without Docker Hub;
                # never the variable BASE_MIRROR, the nightly's (the site's mirror, maybe upstream=mirror pairs, which
                # `make bases` refuses to fill), given to pull requests of this repository but not to forks'.
                "env": {"BASE_MIRROR": "127.0.0.1:5000"},
                "steps": [*HOSTED_SETUP,
                          {"name": "Engine and registry", "run": "make setup"},
                          {"name": "Bases", "run": "make bases FRAMEWORK='${{ matrix.cell }}'"},
                          {"name": "Build and push ${{ matrix.dev_image }}",
                           "run": "make push FRAMEWORK='${{ matrix.cell }}'"},
                          {"name": "Validate", "run": "make validate FRAMEWORK='${{ matrix.cell }}'"}],
            },
        },
    }
    if not cpu_cells:   # every cell needs a GPU: no CPU image to build here (`ci-matrix --cells` of nothing fails)
        del doc["jobs"]["plan"], doc["jobs"]["cpu-image"]
    return doc, cpu_cells


# Every runner of the nightly must reach the same registry: each pushes its dev image and verdict
# there, and the scaling and report jobs (on other runners) read them back. A loopback address
# would be each runner's own registry, so the check refuses it.
REGISTRY_CHECK = """case "$REGISTRY" in
  ""|127.*|localhost|localhost:*|"[::1]"*)
    echo "::error::REGISTRY is '$REGISTRY', not a registry every runner shares:" \\
      "set the repository variable REGISTRY (or the dispatch input registry)" >&2
    exit 1 ;;
esac
echo "shared registry: $REGISTRY"
"""
REGISTRY_STEP = {"name": "Check the shared registry", "run": REGISTRY_CHECK}


# The last nights' verdicts, one folder per night (the Makefile's NIGHTLY_HISTORY): restored from the Actions cache
# before validate (the bus bandwidth baseline) and the report (the trend), which adds tonight's and cuts it to the
# busbw window (NIGHTLY_KEEP). The first night has none: both steps say so and go on.
HISTORY = f"{WRITES}/verdict-history"
SITE = f"{WRITES}/nightly"   # what the report job publishes (NIGHTLY_OUT of the scaling and report steps)
VALIDATE_SETTINGS = {"NIGHTLY_HISTORY": HISTORY}
# The GPU runners' scaling: PyTorch's strategies in the default PyTorch GPU cell, one process per GPU; no JAX run.
SCALING_SETTINGS = {"NIGHTLY_OUT": SITE, "NIGHTLY_JAX_SCALING_CELL": ""}


# On the GPU runners: no usable GPU is a failure (exit 1), not a quietly skipped GPU check.
GPU_ENV = {"DL_IMAGES_REQUIRE_GPU": "1"}
# The runners' signing key (`buildtool keys`); its public half is in config/trusted-keys.yaml.
# Pull-request jobs never get it.
SIGNING_ENV = {"DL_IMAGES_SIGNING_KEY": "${{ secrets.DL_IMAGES_SIGNING_KEY }}"}
# The step that restores the last nights' verdicts (one folder per night, newest last by name: validate compares
# the bus bandwidth with their median, the report's trend with the newest).
RESTORE_HISTORY = {"name": "Last nights' verdicts", "uses": CACHE_RESTORE,
                   "with": {"path": HISTORY, "key": "nightly-verdict-history-${{ github.run_id }}",
                            "restore-keys": "nightly-verdict-history-"}}


def _night_job(name: str, needs: str | list[str], minutes: int, runs_on: str, steps: list[dict[str, Any]],
               **more: Any) -> dict[str, Any]:
    """A nightly job that runs once NEEDS have ended, whatever became of them, on RUNS_ON, with `more` (its
    strategy, env): the shared registry checked and the toolkit set up before STEPS."""
    return {"name": name, "needs": needs, "if": "${{ !cancelled() }}", "runs-on": runs_on,
            "timeout-minutes": minutes, **more, "steps": [REGISTRY_STEP, *SELF_HOSTED_SETUP, *steps]}


def nightly_workflow(matrix: Matrix, options: WorkflowOptions) -> dict[str, Any]:
    labels = _labels_expr(options)
    plan = _plan_job([c.key for c in matrix.cells])
    plan["steps"].insert(0, REGISTRY_STEP)
    jobs: dict[str, Any] = {"plan": plan, "build-validate": _build_validate_job(labels, matrix)}
    for platform, gpu_cells in native_gpu_cells(matrix).items():
        jobs.update(_platform_jobs(options, labels, platform, gpu_cells))
    scaling_cell = next((c for c in matrix.cells if c.framework == "pytorch" and c.needs_gpu and c.default), None)
    if scaling_cell is not None:
        jobs["scaling"] = _scaling_job(labels, scaling_cell.key, options.scaling_counts)
    jobs["report"] = _report_job(labels, [job for job in jobs if job != "plan"])   # every job after the plan
    jobs["publish"] = {
        "needs": "report",
        # Opt in per repository once GitHub Pages is enabled (variable PUBLISH_PAGES=true).
        "if": "${{ !cancelled() && needs.report.result == 'success' && vars.PUBLISH_PAGES == 'true' }}",
        "runs-on": HOSTED_RUNNER, "timeout-minutes": 10,
        "permissions": {"pages": "write", "id-token": "write"},
        "environment": {"name": "github-pages", "url": "${{ steps.deploy.outputs.page_url }}"},
        "steps": [{"id": "deploy", "uses": PAGES_DEPLOY}],
    }
    return {
        "name": "nightly",
        "on": {"schedule": [{"cron": options.nightly_cron}], "workflow_dispatch": {"inputs": {
            "registry": {"description": "Registry every runner shares (default: the REGISTRY variable)",
                         "required": False, "type": "string", "default": ""}}}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "nightly", "cancel-in-progress": False},
        # BASE_MIRROR: a pull-through cache of nvcr.io and Docker Hub, when the site has one.
        "env": {"REGISTRY": "${{ inputs.registry || vars.REGISTRY }}", "BASE_MIRROR": "${{ vars.BASE_MIRROR }}"},
        "jobs": jobs,
    }


def _build_validate_job(labels: str, matrix: Matrix) -> dict[str, Any]:
    return {
        "name": "${{ matrix.cell }} on GPU runners",
        "needs": "plan",
        "runs-on": labels, "timeout-minutes": 180,
        "strategy": {"fail-fast": False, "matrix": "${{ fromJSON(needs.plan.outputs.matrix) }}"},
        # The bus bandwidth is compared with the median of the last nights' verdicts of the cell on
        # the same GPUs (nightly-validate passes the history when there is one).
        "env": GPU_ENV,
        "steps": [REGISTRY_STEP, *SELF_HOSTED_SETUP,
                  {"name": "Build and push ${{ matrix.dev_image }}",
                   "run": "make push FRAMEWORK='${{ matrix.cell }}'",
                   # The build jobs' key signs each image's provenance and SBOM (`buildtool keys --role
                   # builder`, trusted as builder in config/trusted-keys.yaml); the builder id is this run.
                   "env": {"DL_IMAGES_BUILDER_KEY": "${{ secrets.DL_IMAGES_BUILDER_KEY }}",
                           "DL_IMAGES_BUILDER_ID": "${{ github.server_url }}/${{ github.repository }}"
                                                   "/actions/runs/${{ github.run_id }}"}},
                  RESTORE_HISTORY,
                  _validate_step(matrix)],
    }


def _platform_jobs(options: WorkflowOptions, labels: str, platform: str,
                   gpu_cells: list[str]) -> dict[str, dict[str, Any]]:
    """A platform other than the hosted runners': its CPU checks under QEMU on the amd64 runners (its GPU checks
    not run: incomplete), each night, whether or not its GPU runners are up; and the native job, which waits for
    it, so the verdict release reads (the newest) is the native one when both ran. Deadline: validate.deadline_s
    x emulation_factor. Both jobs, by id."""
    emulated_id = f"emulated-{platform.replace('/', '-')}"
    strategy = {"fail-fast": False, "matrix": {"cell": gpu_cells}}
    emulated = _night_job(
        f"${{{{ matrix.cell }}}} {platform} under QEMU (CPU checks)", "build-validate", 240, labels,
        [{"name": f"Validate {platform} under QEMU and push the signed verdict (GPU checks not run)",
          "run": f"make validate-emulated FRAMEWORK='${{{{ matrix.cell }}}}' PLATFORM={platform}",
          "env": SIGNING_ENV}],
        strategy=strategy)
    # The index (every platform) is pushed by the build job; the emulated verdict comes first.
    native = _night_job(
        f"${{{{ matrix.cell }}}} on {platform} GPU runners", ["build-validate", emulated_id], 180,
        _labels_expr(options, platform),
        [RESTORE_HISTORY,
         {"name": f"Validate {platform} with GPUs and push the signed verdict",
          "run": _make("nightly-validate", FRAMEWORK="'${{ matrix.cell }}'", PLATFORM=platform, **VALIDATE_SETTINGS),
          "env": SIGNING_ENV}],
        strategy=strategy, env=GPU_ENV)
    return {emulated_id: emulated, f"validate-{platform.replace('/', '-')}": native}


def _scaling_job(labels: str, cell: str, counts: str) -> dict[str, Any]:
    return _night_job(f"Scaling of {cell} (DDP, FSDP, DeepSpeed side by side)", "build-validate", 60, labels, [
        {"name": "Scaling run", "run": _make("nightly-scaling", NIGHTLY_SCALING_CELL=cell,
                                             NIGHTLY_SCALING_COUNTS=counts, **SCALING_SETTINGS)},
        {"if": "always()", "uses": UPLOAD,
         "with": {"name": "scaling", "path": f"{SITE}/scaling/", "if-no-files-found": "ignore"}}], env=GPU_ENV)


def _report_job(labels: str, needs: list[str]) -> dict[str, Any]:
    return _night_job("nightly report", needs, 20, labels, [
        RESTORE_HISTORY,
        {"uses": DOWNLOAD, "continue-on-error": True, "with": {"name": "scaling", "path": f"{SITE}/scaling"}},
        # `make nightly-report` (the trend against the newest night in the history, tonight's verdicts added to it
        # under the run's id), then the Markdown report as the run's summary.
        {"name": "Report", "run": _make("nightly-report", **SCALING_SETTINGS, NIGHTLY_HISTORY=HISTORY,
                                        NIGHTLY_RUN_ID="${{ github.run_id }}") + "\n"
                                  f'cat {SITE}/report.md >> "$GITHUB_STEP_SUMMARY"\n'},
        {"name": "Keep the last nights' verdicts for tomorrow", "if": "always()", "uses": CACHE_SAVE,
         "with": {"path": HISTORY, "key": "nightly-verdict-history-${{ github.run_id }}"}},
        {"if": "always()", "uses": UPLOAD, "with": {"name": "nightly-report", "path": f"{SITE}/"}},
        {"name": "Publish", "uses": PAGES_UPLOAD, "with": {"path": f"{SITE}/"}}])


def release_workflow(matrix: Matrix) -> dict[str, Any]:
    inputs = {"VERSION": "${{ inputs.version }}", "FRAMEWORK": "${{ inputs.framework }}", "FROM": "${{ inputs.from }}"}
    return {
        "name": "release",
        "on": {"workflow_dispatch": {"inputs": {
            "version": {"description": "Release version filled into the release tags (e.g. 2026.11.1)",
                        "required": True, "type": "string"},
            "framework": {"description": "Which images to release", "required": True, "type": "choice",
                          "default": "all", "options": ["all", *matrix.image_names]},
            "from": {"description": "Commit whose validated dev images to promote (default: the dispatched one)",
                     "required": False, "type": "string", "default": ""},
        }}},
        "permissions": {"contents": "read"},
        "concurrency": {"group": "release", "cancel-in-progress": False},
        "env": {"REGISTRY": "${{ vars.REGISTRY || '127.0.0.1:5000' }}",
                "RELEASE_REGISTRY": "${{ vars.RELEASE_REGISTRY || vars.REGISTRY || '127.0.0.1:5000' }}"},
        "jobs": {
            "release": {
                "name": "release ${{ inputs.version }}",
                # On the site's own runners: they reach the registry the nightly pushed dev images to.
                "runs-on": _runs_on("RELEASE_RUNNER_LABELS", DEFAULT_RELEASE_LABELS),
                "timeout-minutes": 30,
                # Every commit: the gate reads each image's revision in git (an ancestor of the release commit, its
                # files as committed there); a shallow clone knows the dispatched commit only.
                "steps": [{**SELF_HOSTED_CHECKOUT, "with": {"fetch-depth": 0, "persist-credentials": False}},
                          *SELF_HOSTED_SETUP[1:],
                          # The plan of the dev images `make release` promotes: those of FROM when it is given.
                          {"name": "Check the version",
                           "run": f"mkdir -p {WRITES}\n.venv/bin/python -m buildtool plan --framework \"$FRAMEWORK\" "
                                  '--release "$VERSION" ${FROM:+--revision "$FROM"} '
                                  f"--json > {RELEASE_PLAN_FILE}\n",
                           "env": inputs},
                          {"name": "Retag the validated dev images",
                           # The inputs in the environment only: make expands a `$(...)` in a command-line setting.
                           "run": "make release\n",
                           "env": inputs},
                          {"uses": UPLOAD, "with": {"name": "release-plan", "path": RELEASE_PLAN_FILE}},
                          # What the release wrote in the checkout (its manifest and notes, the catalogue that lists
                          # it), which the next job's checkout deletes: kept to be committed.
                          {"name": "Keep the release manifest, notes and catalogue", "uses": UPLOAD,
                           "with": {"name": "release-files", "path": f"{RELEASES_DIR}/\n{CATALOGUE_PATH}\n",
                                    "if-no-files-found": "error"}}],
            },
        },
    }


def render_workflows(matrix: Matrix, options: WorkflowOptions | None = None) -> dict[str, bytes]:
    options = options or WorkflowOptions()
    pr, pr_cells = pull_request_workflow(matrix)
    cells = [c.key for c in matrix.cells]
    native = "".join(_cells_note(f"GPU cells validated on native {platform} runners", gpu_cells)
                     for platform, gpu_cells in native_gpu_cells(matrix).items())
    return {
        PR_PATH: dump_workflow(pr, _cells_note("Cells built on pull requests (no GPU needed)", pr_cells)),
        NIGHTLY_PATH: dump_workflow(nightly_workflow(matrix, options),
                                    _cells_note("Cells built and validated nightly", cells) + native),
        RELEASE_PATH: dump_workflow(release_workflow(matrix), _cells_note("Cells released", cells)),
    }


def ci_matrix(plan: Any, cells: list[str]) -> dict[str, Any]:
    """`buildtool plan --json` output narrowed to `cells` (in plan order); unknown cells are an error."""
    include = plan.get("include") if isinstance(plan, dict) else None
    if not isinstance(include, list):
        raise ValueError("plan JSON has no `include` list; produce it with `buildtool plan --json`")
    # Any JSON parses: an entry that is no object naming its cell is a wrong file, not a crash.
    if not all(isinstance(entry, dict) and isinstance(entry.get("cell"), str) for entry in include):
        raise ValueError("plan JSON `include` has an entry that is not an object with a `cell` name; "
                         "produce it with `buildtool plan --json`")
    known = {entry.get("cell") for entry in include}
    missing = [c for c in cells if c not in known]
    if missing:
        raise ValueError(f"cells {', '.join(missing)} are not in the plan; regenerate the workflows (`make render`)")
    return {"include": [entry for entry in include if entry.get("cell") in set(cells)]}
