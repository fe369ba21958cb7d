"""Generated GitHub Actions workflows: deterministic, from the matrix, drift-checked, schema-valid."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from buildtool.contracts import names
from buildtool.matrix.loader import load_matrix
from buildtool.render.workflows import NIGHTLY_PATH, PR_PATH, RELEASE_PATH, WorkflowOptions, ci_matrix, render_workflows
from tests.conftest import REPO, fixture_matrix

PATHS = (PR_PATH, NIGHTLY_PATH, RELEASE_PATH)


def matrix():
    """The fixture matrix: what the workflows' contents are asserted on."""
    return fixture_matrix()


def real_matrix():
    """The project's own matrix.yaml: only for the checks of the committed workflows."""
    return load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml")


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is missing: pip install -e '.[dev]'"
    return subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True,
                          text=True, timeout=120)


def test_real_project_workflows_are_deterministic_and_committed() -> None:
    """The real project: its committed workflows are what its matrix.yaml renders."""
    first, second = render_workflows(real_matrix()), render_workflows(real_matrix())
    assert first == second and set(first) == set(PATHS)
    for rel, data in first.items():
        assert (REPO / rel).read_bytes() == data, f"{rel} drifted: run `make render`"


@pytest.mark.tools("check-jsonschema")
@pytest.mark.parametrize("rel", PATHS)
def test_real_project_committed_workflows_pass_the_github_schema(rel: str) -> None:
    proc = check_jsonschema(REPO / rel)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.tools("check-jsonschema")
def test_the_schema_check_catches_a_broken_workflow(tmp_path: Path) -> None:
    doc = load(NIGHTLY_PATH)
    del doc["jobs"]["build-validate"]["runs-on"]
    doc["jobs"]["report"]["timeout-minutes"] = "soon"
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(doc))
    assert check_jsonschema(broken).returncode != 0


def load(rel: str, options: WorkflowOptions | None = None) -> dict:
    return yaml.safe_load(render_workflows(matrix(), options)[rel])


def validates(step: dict) -> bool:
    """A step that runs one of the Makefile's validate targets (validate, nightly-validate, validate-emulated)."""
    words = step.get("run", "").split()
    return words[:1] == ["make"] and "validate" in words[1]


def test_pull_request_builds_exactly_the_cells_without_gpu() -> None:
    doc = load(PR_PATH)
    # The key is written quoted ('on'), so YAML 1.1 readers do not turn it into True.
    assert set(doc["on"]) == {"pull_request", "push"}
    assert set(doc["jobs"]) == {"check", "lint", "test", "plan", "cpu-image"}
    plan_step = next(s for s in doc["jobs"]["plan"]["steps"] if s.get("id") == "plan")
    cells = plan_step["run"].split("--cells ")[1].split()[0].split(",")
    assert cells == [c.key for c in matrix().cells if not c.needs_gpu] == ["pytorch-cpu:2.13", "tensorflow-cpu:2.21"]
    job = doc["jobs"]["cpu-image"]
    assert job["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    runs = [s.get("run", "") for s in job["steps"]]
    assert "make push FRAMEWORK='${{ matrix.cell }}'" in runs and "make validate FRAMEWORK='${{ matrix.cell }}'" in runs
    checks = " ".join(s.get("run", "") for s in doc["jobs"]["check"]["steps"])
    assert "make check" in checks and "check-jsonschema --builtin-schema vendor.github-workflows" in checks


def test_nightly_runs_every_cell_on_configurable_gpu_runners() -> None:
    doc = load(NIGHTLY_PATH, WorkflowOptions(gpu_labels=("self-hosted", "h100"), nightly_cron="0 3 * * *"))
    assert doc["on"]["schedule"] == [{"cron": "0 3 * * *"}]
    plan_step = next(s for s in doc["jobs"]["plan"]["steps"] if s.get("id") == "plan")
    assert plan_step["run"].split("--cells ")[1].split()[0].split(",") == [c.key for c in matrix().cells]
    runs_on = doc["jobs"]["build-validate"]["runs-on"]
    assert runs_on == """${{ fromJSON(vars.GPU_RUNNER_LABELS || '["self-hosted","h100"]') }}"""
    assert doc["jobs"]["report"]["needs"] == ["build-validate", "scaling"]
    report = " ".join(s.get("run", "") for s in doc["jobs"]["report"]["steps"])
    assert "make nightly-report NIGHTLY_OUT=reports/nightly" in report
    assert "NIGHTLY_HISTORY=reports/verdict-history" in report
    assert "GITHUB_STEP_SUMMARY" in report
    assert "NIGHTLY_SCALING_CELL=pytorch-ngc:25.10" in doc["jobs"]["scaling"]["steps"][-2]["run"]


def test_release_is_manual_with_a_version_input() -> None:
    doc = load(RELEASE_PATH)
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert inputs["version"] == {"description": inputs["version"]["description"], "required": True, "type": "string"}
    assert inputs["framework"]["options"] == ["all", *matrix().image_names]
    step = next(s for s in doc["jobs"]["release"]["steps"] if "make release" in s.get("run", ""))
    assert step["env"]["VERSION"] == "${{ inputs.version }}" and step["env"]["FROM"] == "${{ inputs.from }}"
    assert "RELEASE_RUNNER_LABELS" in doc["jobs"]["release"]["runs-on"]  # where the site registry is reachable


def test_ci_matrix_narrows_real_plan_output(run_cli, tmp_path: Path, fixture_project: Path) -> None:
    code, out, err = run_cli("plan", "--json", "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 0, err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    code, out, err = run_cli("workflows", "ci-matrix", "--plan", str(plan), "--cells",
                             "tensorflow-cpu:2.21,pytorch-cpu:2.13")
    assert code == 0, err
    assert out.startswith("matrix=") and out.count("\n") == 1  # one line, as $GITHUB_OUTPUT needs
    include = json.loads(out.removeprefix("matrix="))["include"]
    assert [e["cell"] for e in include] == ["pytorch-cpu:2.13", "tensorflow-cpu:2.21"]  # plan order
    assert names.parse_dev_tag(include[0]["dev_image"].rsplit(":", 1)[1], "2.13") is not None
    assert include[0]["needs_gpu"] is False
    code, out, err = run_cli("workflows", "ci-matrix", "--plan", str(plan), "--cells", "pytorch-cpu:9.9")
    assert code == 2 and out == "" and "pytorch-cpu:9.9" in err


def test_the_plan_jobs_cell_list_of_a_big_matrix_is_one_ci_matrix_takes(run_cli, tmp_path: Path) -> None:
    """The plan job runs `ci-matrix --cells` with every cell of the workflow, and --cells took at most 512
    characters (one selector's bound): a matrix of some 20 cells rendered a nightly whose plan job failed every
    night with exit 2. ci-matrix takes the list the render writes."""
    from buildtool.render.workflows import _plan_job

    cells = [f"pytorch-cuda-{n}:2.{n}.0-cu129" for n in range(40)]
    run = next(step["run"] for step in _plan_job(cells)["steps"] if step.get("id") == "plan")
    given = run.split("--cells ", 1)[1].split()[0]
    assert len(given) > 512 and given.split(",") == cells
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"include": [{"cell": c} for c in cells]}))
    code, out, err = run_cli("workflows", "ci-matrix", "--plan", str(plan), "--cells", given)
    assert code == 0, err
    assert [e["cell"] for e in json.loads(out.removeprefix("matrix="))["include"]] == cells


@pytest.mark.parametrize("cells", ["", ",", ",,"])
def test_ci_matrix_refuses_an_empty_cell_list(run_cli, tmp_path: Path, cells: str) -> None:
    """`--cells ,` names no cell: an empty CI matrix is refused (exit 2), never printed."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"include": [{"cell": "pytorch-cpu:2.13"}]}')
    code, out, err = run_cli("workflows", "ci-matrix", "--plan", str(plan), "--cells", cells)
    assert code == 2 and out == "", out
    assert "--cells" in err and len(err.strip().splitlines()) == 1


def test_ci_matrix_rejects_non_plan_json() -> None:
    with pytest.raises(ValueError, match="include"):
        ci_matrix({"cells": []}, ["x"])


@pytest.mark.parametrize("text", ['[]', '"x"', '{"include": [1]}', '{"include": [5]}', '{"include": [{"cell": [1]}]}',
                                  '{"include": [{}]}'])
def test_ci_matrix_refuses_a_plan_json_of_the_wrong_shape(run_cli, tmp_path: Path, text: str) -> None:
    """Any JSON parses: a plan that is no object, or an `include` entry that is no object naming its cell, is one
    line naming the file (exit 2), not an AttributeError."""
    plan = tmp_path / "plan.json"
    plan.write_text(text)
    code, out, err = run_cli("workflows", "ci-matrix", "--plan", str(plan), "--cells", "pytorch-cpu:2.13")
    assert code == 2 and out == "", err
    assert str(plan) in err and "buildtool plan --json" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_check_fails_when_a_workflow_is_edited_by_hand(project: Path, run_cli) -> None:
    path = project / NIGHTLY_PATH
    rendered = path.read_text()
    path.write_text(rendered.replace("timeout-minutes: 180", "timeout-minutes: 5"))
    code, out, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1 and "+    timeout-minutes: 180" in out and NIGHTLY_PATH in out
    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and (project / NIGHTLY_PATH).read_text() == rendered


def test_a_new_cell_changes_the_workflows(project: Path, run_cli) -> None:
    text = (project / "matrix.yaml").read_text()
    text = text.replace('''      - version: "2.13"
        default: true
        framework_version: 2.13.0+cpu''', '''      - version: "2.12"
        framework_version: 2.12.0+cpu
        framework_requirements: ["torch==2.12.0+cpu"]
      - version: "2.13"
        default: true
        framework_version: 2.13.0+cpu''')
    (project / "matrix.yaml").write_text(text)
    code, out, _ = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1 and "pytorch-cpu:2.12" in out and PR_PATH in out


@pytest.mark.tools("check-jsonschema")
def test_workflows_write_with_custom_labels(run_cli, tmp_path: Path, fixture_project: Path) -> None:
    code, out, err = run_cli("workflows", "write", "--gpu-labels", "self-hosted,a100", "--out", str(tmp_path),
                             "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 0, err
    written = (tmp_path / NIGHTLY_PATH).read_text()
    assert '["self-hosted","a100"]' in written
    assert check_jsonschema(tmp_path / NIGHTLY_PATH).returncode == 0
    code, _, err = run_cli("workflows", "write", "--gpu-labels", " , ", "--out", str(tmp_path),
                           "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 2 and "--gpu-labels" in err


def test_only_the_nightly_runners_get_the_verdict_signing_key() -> None:
    """Verdicts the release trusts are signed by the GPU runners; pull-request jobs (untrusted code)
    validate with a throwaway dev key, whose verdicts release refuses."""
    steps = [s for job in load(NIGHTLY_PATH)["jobs"].values() for s in job.get("steps", [])]
    validate = [s for s in steps if validates(s)]
    assert len(validate) == 1 and all(s["env"]["DL_IMAGES_SIGNING_KEY"] == "${{ secrets.DL_IMAGES_SIGNING_KEY }}"
                            for s in validate)
    assert "DL_IMAGES_SIGNING_KEY" not in render_workflows(matrix())[PR_PATH].decode()


def test_only_the_nightly_build_jobs_get_the_builder_key() -> None:
    """Provenance and SBOMs release trusts are signed by the build jobs' builder key, named by the run;
    pull-request jobs sign with a throwaway dev key, and a verdict step never sees the builder key."""
    steps = [s for job in load(NIGHTLY_PATH)["jobs"].values() for s in job.get("steps", [])]
    push = [s for s in steps if "make push" in s.get("run", "")]
    assert push and all(s["env"]["DL_IMAGES_BUILDER_KEY"] == "${{ secrets.DL_IMAGES_BUILDER_KEY }}"
                        and s["env"]["DL_IMAGES_BUILDER_ID"].endswith("/actions/runs/${{ github.run_id }}")
                        for s in push)
    assert all("DL_IMAGES_BUILDER_KEY" not in s.get("env", {}) for s in steps if validates(s))
    assert "DL_IMAGES_BUILDER_KEY" not in render_workflows(matrix())[PR_PATH].decode()


def multi_platform_matrix():  # noqa: ANN201
    """The fixture matrix with pytorch-ngc (a GPU cell) and pytorch-cpu on linux/amd64 and linux/arm64."""
    import dataclasses

    both = ("linux/amd64", "linux/arm64")
    cells = tuple(dataclasses.replace(c, platforms=both, emulation_factor=4)
                  if c.key in ("pytorch-ngc:25.10", "pytorch-cpu:2.13") else c for c in matrix().cells)
    return dataclasses.replace(matrix(), cells=cells)


def test_nightly_validates_each_gpu_cells_arm64_on_native_arm64_gpu_runners() -> None:
    doc = yaml.safe_load(render_workflows(multi_platform_matrix())[NIGHTLY_PATH])
    job = doc["jobs"]["validate-linux-arm64"]
    assert job["runs-on"] == ("${{ fromJSON(vars.GPU_RUNNER_LABELS_ARM64 || "
                              """'["self-hosted","linux","arm64","gpu","gh200"]') }}""")
    assert job["strategy"]["matrix"] == {"cell": ["pytorch-ngc:25.10"]}   # GPU cells with arm64 only: one job each
    assert job["needs"] == ["build-validate", "emulated-linux-arm64"] and job["env"]["DL_IMAGES_REQUIRE_GPU"] == "1"
    [validate] = [s for s in job["steps"] if validates(s)]
    assert validate["run"] == ("make nightly-validate FRAMEWORK='${{ matrix.cell }}' PLATFORM=linux/arm64 "
                               "NIGHTLY_HISTORY=reports/verdict-history")
    assert validate["env"] == {"DL_IMAGES_SIGNING_KEY": "${{ secrets.DL_IMAGES_SIGNING_KEY }}"}
    assert "validate-linux-arm64" in doc["jobs"]["report"]["needs"]
    # The amd64 runners build every platform and validate a GPU cell's amd64 manifest only; a CPU cell's
    # every platform (arm64 under emulation).
    build = doc["jobs"]["build-validate"]
    assert build["runs-on"] == """${{ fromJSON(vars.GPU_RUNNER_LABELS || '["self-hosted","linux","x64","gpu"]') }}"""
    [step] = [s for s in build["steps"] if validates(s)]
    assert step["env"]["PLATFORM"] == ("${{ contains(fromJSON('[\"pytorch-ngc:25.10\"]'), matrix.cell) "
                                       "&& 'linux/amd64' || '' }}")
    assert step["run"] == ("make nightly-validate FRAMEWORK='${{ matrix.cell }}' "
                           "NIGHTLY_HISTORY=reports/verdict-history PLATFORM=\"$PLATFORM\"")
    assert "# GPU cells validated on native linux/arm64 runners: pytorch-ngc:25.10" in \
        render_workflows(multi_platform_matrix())[NIGHTLY_PATH].decode()


def test_nightly_validates_a_gpu_cells_arm64_under_qemu_first_so_the_native_verdict_is_the_newest() -> None:
    """Issue 38: the CPU checks of the arm64 image every night on the amd64 runners (GPU checks not run: an
    incomplete verdict, which release never counts); the GH200 job runs after it, so release reads its verdict."""
    doc = yaml.safe_load(render_workflows(multi_platform_matrix())[NIGHTLY_PATH])
    job = doc["jobs"]["emulated-linux-arm64"]
    assert job["runs-on"] == doc["jobs"]["build-validate"]["runs-on"]   # amd64 runners, arm64 under QEMU
    assert job["needs"] == "build-validate" and job["strategy"]["matrix"] == {"cell": ["pytorch-ngc:25.10"]}
    assert "DL_IMAGES_REQUIRE_GPU" not in job.get("env", {})
    [step] = [s for s in job["steps"] if validates(s)]
    assert step["run"] == "make validate-emulated FRAMEWORK='${{ matrix.cell }}' PLATFORM=linux/arm64"
    assert "emulated-linux-arm64" in doc["jobs"]["validate-linux-arm64"]["needs"]
    assert "emulated-linux-arm64" in doc["jobs"]["report"]["needs"]
    make = (REPO / "Makefile").read_text()
    assert "validate-emulated: ##" in make
    assert ("$(BUILDTOOL) validate --framework $(call quote,$(or $(FRAMEWORK),pytorch-cuda)) \\\n"
            "\t\t--platform $(call quote,$(or $(PLATFORM),linux/arm64))") in make


def test_nightly_has_no_arm64_job_without_an_arm64_gpu_cell() -> None:
    doc = load(NIGHTLY_PATH)
    assert not any(job.startswith(("validate-", "emulated-")) for job in doc["jobs"])
    [step] = [s for s in doc["jobs"]["build-validate"]["steps"] if validates(s)]
    assert step["run"] == ("make nightly-validate FRAMEWORK='${{ matrix.cell }}' "
                           "NIGHTLY_HISTORY=reports/verdict-history")
    assert "PLATFORM" not in step["env"]


def test_a_gpu_cell_of_a_platform_without_runner_labels_is_refused() -> None:
    with pytest.raises(ValueError, match="no GPU runner labels for linux/arm64"):
        render_workflows(multi_platform_matrix(), WorkflowOptions(platform_gpu_labels=()))


@pytest.mark.tools("check-jsonschema")
def test_the_multi_platform_nightly_passes_the_github_schema(tmp_path: Path) -> None:
    path = tmp_path / "nightly.yml"
    path.write_bytes(render_workflows(multi_platform_matrix())[NIGHTLY_PATH])
    proc = check_jsonschema(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# What a workflow step may run besides a Makefile target: the runner's own mechanics (the plan job's matrix,
# checks of the workflow itself, the venv, the release's version check and the run's summary).
NOT_MAKE = ("python -m buildtool plan --json > reports/", "python -m buildtool workflows ci-matrix",
            "check-jsonschema --builtin-schema", "python3 -m venv .venv", ".venv/bin/python -m pip install -e",
            "python -m pip install -e", '.venv/bin/python -m buildtool plan --framework "$FRAMEWORK" --release',
            'cat reports/nightly/report.md >> "$GITHUB_STEP_SUMMARY"', "mkdir -p reports")


def makefile_targets() -> set[str]:
    import re

    return set(re.findall(r"^([a-zA-Z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def test_every_workflow_step_runs_a_makefile_target_as_the_makefile_defines_it() -> None:
    """Issue 55: what CI proves is what the runners run: each toolkit step of the committed workflows is
    `make TARGET SETTINGS` (one definition, in the Makefile), and the nightly's jobs run exactly the targets
    `make nightly` runs (plus the emulated validation of a GPU cell's other platform)."""
    import re

    targets, nightly_targets = makefile_targets(), set()
    for rel in PATHS:
        doc = yaml.safe_load((REPO / rel).read_text())
        for job in doc["jobs"].values():
            for step in job.get("steps", []):
                for line in filter(None, (ln.strip() for ln in step.get("run", "").splitlines())):
                    if line.startswith("make "):
                        target = line.split()[1]
                        assert target in targets, (rel, line)
                        if rel == NIGHTLY_PATH:
                            nightly_targets.add(target)
                        continue
                    if step.get("name") == "Check the shared registry":
                        continue
                    assert line.startswith(NOT_MAKE), f"{rel}: a step runs {line!r}, not a Makefile target"
    recipe = (REPO / "Makefile").read_text().split("\nnightly:", 1)[1].split("\n\n", 1)[0]
    run_by_make_nightly = set(re.findall(r"\$\(SUBMAKE\) ([\w-]+)", recipe))
    assert run_by_make_nightly == {"push", "nightly-validate", "nightly-scaling", "nightly-report"}
    assert nightly_targets == run_by_make_nightly | {"validate-emulated"}


def test_what_the_workflows_write_in_the_checkout_is_ignored_by_git() -> None:
    """An untracked file makes the revision `<sha>-dirty.<hash>`: the release workflow's release-plan.json in the
    checkout made `make release` look for dev images of a dirty revision and refuse (found by running its steps,
    tests/integration/test_nightly_release.py), and the restored verdict history did the same to the nightly's
    validate and report. Every path the workflows write is under an ignored folder."""
    from buildtool.render import workflows

    written = [workflows.PLAN_FILE, workflows.RELEASE_PLAN_FILE, workflows.HISTORY, f"{workflows.SITE}/report.md"]
    texts = b"".join(render_workflows(real_matrix()).values()).decode()
    assert all(path in texts for path in written)
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", *written], capture_output=True,
                             text=True, timeout=30)
    assert ignored.stdout.split() == written, ignored.stdout + ignored.stderr


def test_a_matrix_whose_every_cell_needs_a_gpu_gets_no_cpu_image_jobs() -> None:
    """Its plan job ran `ci-matrix --cells` with no cell, and that job failed on every pull request."""
    from types import SimpleNamespace

    from buildtool.render.workflows import pull_request_workflow

    gpu_only = SimpleNamespace(cells=[c for c in matrix().cells if c.needs_gpu])
    doc, cells = pull_request_workflow(gpu_only)  # type: ignore[arg-type]
    assert cells == [] and set(doc["jobs"]) == {"check", "lint", "test"}


def arm64_only_matrix():  # noqa: ANN201
    """The multi-platform fixture with pytorch-cuda, a GPU cell, built for linux/arm64 only."""
    import dataclasses

    cells = tuple(dataclasses.replace(c, platforms=("linux/arm64",), emulation_factor=4)
                  if c.key == "pytorch-cuda:2.13" else c for c in multi_platform_matrix().cells)
    return dataclasses.replace(multi_platform_matrix(), cells=cells)


def test_a_gpu_cell_of_arm64_only_is_validated_only_on_arm64_gpu_runners() -> None:
    """An arm64-only GPU cell was validated in the amd64 build job with PLATFORM=linux/amd64, which validate refuses
    (an index of linux/arm64 only): it failed every night. The build job skips its validation; the native arm64
    job validates it."""
    doc = yaml.safe_load(render_workflows(arm64_only_matrix())[NIGHTLY_PATH])
    [step] = [s for s in doc["jobs"]["build-validate"]["steps"] if validates(s)]
    assert step["if"] == "${{ !contains(fromJSON('[\"pytorch-cuda:2.13\"]'), matrix.cell) }}"
    # the amd64 manifest of the multi-platform GPU cell only: never the arm64-only cell's
    assert step["env"]["PLATFORM"] == ("${{ contains(fromJSON('[\"pytorch-ngc:25.10\"]'), matrix.cell) "
                                       "&& 'linux/amd64' || '' }}")
    native = doc["jobs"]["validate-linux-arm64"]
    assert native["strategy"]["matrix"] == {"cell": ["pytorch-ngc:25.10", "pytorch-cuda:2.13"]}
    assert "GPU_RUNNER_LABELS_ARM64" in native["runs-on"]
    # The build job still builds it (and validates every other cell): only the validation step is skipped.
    assert "if" not in next(s for s in doc["jobs"]["build-validate"]["steps"] if "make push" in s.get("run", ""))


@pytest.mark.tools("check-jsonschema")
def test_the_arm64_only_nightly_passes_the_github_schema(tmp_path: Path) -> None:
    path = tmp_path / "nightly.yml"
    path.write_bytes(render_workflows(arm64_only_matrix())[NIGHTLY_PATH])
    proc = check_jsonschema(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("cron", "refused"), [
    ("99 99 99 99 99", "the minute '99'"), ("- - - - -", "the minute '-'"), ("*/0 * * * *", "the minute '*/0'"),
    ("0 5-1 * * *", "the hour '5-1'"), ("0 0 0 * *", "the day of the month '0'"), ("0 0 * 13 *", "the month '13'"),
    ("0 0 * * 9", "the day of the week '9'")])
def test_a_cron_out_of_its_fields_ranges_is_refused_before_writing(run_cli, tmp_path: Path, fixture_project: Path,
                                                                  cron: str, refused: str) -> None:
    """--cron was checked only for its characters: `99 99 99 99 99` was written into nightly.yml, a workflow GitHub
    refuses, so the nightly never ran. Each field is checked against its range now, and nothing is written."""
    code, out, err = run_cli("workflows", "write", "--cron", cron, "--out", str(tmp_path / "wf"),
                             "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 2 and err.startswith(f"error: --cron {cron!r}: {refused} is not *, N or N-M"), err
    assert not (tmp_path / "wf").exists()
    code, out, err = run_cli("workflows", "write", "--cron", "*/15 0-23/2 1,15 1-12 1-5", "--out", str(tmp_path / "ok"),
                             "--matrix", str(fixture_project / "matrix.yaml"))
    assert code == 0, err


def test_the_release_checks_out_every_commit_for_the_ancestry_check() -> None:
    """actions/checkout fetches one commit by default: release's gate then found no image's revision in git ("is not a
    commit git knows"), so every image carried over from an earlier commit, and every `from`, was refused. The release
    job clones the whole history (fetch-depth 0)."""
    [job] = load(RELEASE_PATH)["jobs"].values()
    [checkout] = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout["with"]["fetch-depth"] == 0
    assert job["steps"].index(checkout) == 0


def test_the_release_plan_names_the_dev_images_of_from(project: Path) -> None:
    """The release's `Check the version` step planned the dispatched commit's dev images whatever `from` said, so the
    release-plan artifact named images `make release` (which promotes those of FROM) never read. It plans FROM's."""
    import os
    import sys

    [job] = yaml.safe_load((project / RELEASE_PATH).read_text())["jobs"].values()
    [step] = [s for s in job["steps"] if s.get("name") == "Check the version"]
    assert step["env"]["FROM"] == "${{ inputs.from }}"
    script = step["run"].replace(".venv/bin/python", sys.executable)
    env = {**os.environ, "PYTHONPATH": str(REPO), "VERSION": "1.2.0", "FRAMEWORK": "pytorch-cpu", "FROM": "nightly-42"}
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    [planned] = json.loads((project / "reports" / "release-plan.json").read_text())["include"]
    assert planned["dev_image"].endswith("/pytorch-cpu-dev:nightly-42-2.13"), planned["dev_image"]


def test_the_release_keeps_the_files_it_writes() -> None:
    """`make release` writes the release's manifest and notes (docs/releases/<version>.json, .md) and the catalogue
    (docs/images.md) in the runner's checkout, and the workflow kept only the release plan: the record of the release
    (and the previous release's SBOM the next one's package changes are read against) was deleted with the checkout.
    They are uploaded after the release, a missing one failing the job."""
    [job] = load(RELEASE_PATH)["jobs"].values()
    names = [s.get("name") or s.get("uses") for s in job["steps"]]
    uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    kept = [s for s in uploads if "docs/releases/" in s["with"]["path"].split()]
    assert len(kept) == 1 and kept[0]["with"]["path"].split() == ["docs/releases/", "docs/images.md"]
    assert kept[0]["with"]["if-no-files-found"] == "error" and "if" not in kept[0]
    assert names.index(kept[0]["name"]) > names.index("Retag the validated dev images")
    assert len({s["with"]["name"] for s in uploads}) == len(uploads)   # one artifact name each


def test_pull_request_bases_are_the_jobs_own_whatever_the_nightlys_mirror() -> None:
    """The pull request's image jobs read the repository variable BASE_MIRROR, the nightly's mirror for its GPU runners
    (upstream=mirror pairs, or a site registry the hosted runner cannot reach): `make bases` refused the pairs and
    every pull request of the repository (not a fork's, which get no variables) failed. They fill their own registry."""
    doc = load(PR_PATH)
    assert doc["jobs"]["cpu-image"]["env"]["BASE_MIRROR"] == "127.0.0.1:5000"
    assert "vars.BASE_MIRROR" not in render_workflows(matrix())[PR_PATH].decode()
    assert load(NIGHTLY_PATH)["env"]["BASE_MIRROR"] == "${{ vars.BASE_MIRROR }}"


def test_every_action_is_pinned_by_its_full_commit() -> None:
    """`uses: actions/checkout@v4` ran whatever commit the tag named that day, in jobs that hold the builder and tester
    keys; a moved tag would run other code there. Every action of every workflow is pinned by a 40-hex commit, and each
    file's header names the release tag of each commit it uses."""
    import re

    from buildtool.render.workflows import ACTION_PINS

    for rel, data in render_workflows(real_matrix()).items():
        doc = yaml.safe_load(data)
        uses = [s["uses"] for job in doc["jobs"].values() for s in job.get("steps", []) if "uses" in s]
        assert uses, rel
        for use in uses:
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", use), (rel, use)
            repo = "/".join(use.split("@")[0].split("/")[:2])
            assert use.endswith("@" + ACTION_PINS[repo][0]) and f"{repo} {ACTION_PINS[repo][1]}" in data.decode()


def test_self_hosted_checkouts_leave_no_token_in_the_checkout() -> None:
    """actions/checkout persists the job's GITHUB_TOKEN in .git/config by default; a self-hosted runner keeps its
    work folder between jobs, so the token stayed on disk for the next job (and any code it runs) to read. No job
    pushes to git: every self-hosted checkout sets persist-credentials false."""
    seen = 0
    for path in PATHS:
        for name, job in load(path)["jobs"].items():
            labels = job.get("runs-on")
            if "self-hosted" not in json.dumps(labels) and "RUNNER_LABELS" not in json.dumps(labels):
                continue
            for step in job.get("steps", []):
                if step.get("uses", "").startswith("actions/checkout@"):
                    seen += 1
                    assert step.get("with", {}).get("persist-credentials") is False, (path, name)
    assert seen >= 3    # the nightly's build, validate and report jobs, the release
