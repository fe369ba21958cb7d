"""Rendering as text: golden files, determinism, drift, stale files, atomic writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from buildtool.contracts import label_keys
from buildtool.matrix.loader import load_matrix
from buildtool.render import dockerfiles as render_module
from buildtool.render.catalogue import catalogue_outputs
from buildtool.render.dockerfiles import render_outputs, write_outputs
from buildtool.validate.labels import dockerfile_labels
from tests.conftest import REPO, fixture_image_tests, snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "mini" / "matrix.yaml"
GOLDEN = Path(__file__).parent / "golden"


def _mini_outputs() -> dict[str, bytes]:
    matrix = load_matrix(FIXTURE, REPO / "templates", display="matrix.yaml", tests_dir=fixture_image_tests())
    return render_outputs(matrix, REPO / "templates", extras=(catalogue_outputs,), root=FIXTURE.parent).files


@pytest.mark.parametrize(("rel", "golden"), [
    ("dockerfiles/pytorch/mini-cpu/1.0/Dockerfile", "mini-cpu-1.0.Dockerfile"),
    ("dockerfiles/tensorflow/mini-ngc/25.02/Dockerfile", "mini-ngc-25.02.Dockerfile"),
    ("docs/images.md", "mini-images.md"),
])
def test_golden(rel: str, golden: str):
    """Expected text, reviewed by hand; regenerate with UPDATE_GOLDEN=1 and review the diff."""
    rendered = _mini_outputs()[rel].decode()
    path = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert rendered == path.read_text()


def test_golden_dockerfile_essentials():
    """The properties the golden text is there to pin, stated so a regeneration cannot lose them."""
    text = _mini_outputs()["dockerfiles/pytorch/mini-cpu/1.0/Dockerfile"].decode()
    assert text.startswith("# GENERATED FILE - DO NOT EDIT.\n# Cell mini-cpu:1.0 of matrix.yaml")
    assert "ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim\nFROM ${BASE_IMAGE} AS base\n" in text
    # uv from a stage of its own, by hash, with the pip secrets; never a layer of the image.
    assert "FROM base AS uv\n" in text and "--require-hashes" in text and "uv==0.13.9 --hash=sha256:" in text
    assert "--mount=type=secret,id=pip.conf,target=/run/secrets/pip.conf" in text
    # Installs come from the cell's locks (framework first, own layer), hashes required, no resolution: each
    # PEP 751 lock as the build sees it (local file URLs mapped to the loopback server by the lock-urls secret).
    framework = text.index("--mount=type=bind,source=pylock.framework.toml")
    tools = text.index("--mount=type=bind,source=pylock.tools.toml")
    assert framework < tools and text.count("--require-hashes \\\n      -r /run/pylock.") == 2
    assert text.count("--mount=type=secret,id=lock-urls,target=/run/secrets/lock-urls") == 2
    assert "id=uv.toml" not in text        # the locks name every file: no index is asked
    assert "--mount=type=cache,id=dl-images-uv,target=/run/uv/cache" in text
    # The only pip run installs uv (by hash); every package of the image comes through `uv pip install`.
    assert len(re.findall(r'pip"? install', text)) == text.count("uv pip install") + 1 == 3
    # Every Debian package at the version its apt.lock pins (the named procps too), nothing unlocked.
    assert "      procps=2:4.0.2-3 \\\n" in text and "      'openssl=3.0.20-1~deb12u2' \\\n" in text
    assert "xargs apt-get install -y --no-install-recommends < /run/apt.pins" in text
    assert "which apt.lock does not list" in text
    assert f'{label_keys.RUN_FLAGS}="--shm-size=2g --ulimit=memlock=-1"' in text
    ngc = _mini_outputs()["dockerfiles/tensorflow/mini-ngc/25.02/Dockerfile"].decode()
    assert "apt-get" not in ngc and "--shm-size=16g" in ngc and "--gpus=all" in ngc
    # NGC: only pylock.tools.toml, checked against the base's own PIP_CONSTRAINT files (uv, offline).
    assert "pylock.framework.toml" not in ngc and 'UV_CONSTRAINT="$PIP_CONSTRAINT"' in ngc
    assert "/run/uv/uv pip install --dry-run --offline --no-deps" in ngc


def test_oci_labels_inherit_key_by_key_and_are_quoted(tmp_path: Path):
    """`oci:` merges like `run:`: defaults < image < version, one key at a time; a value with quotes or `$`
    stays one inert LABEL word."""
    old = "        framework_version: 2.13.0+cpu\n"
    text = FIXTURE.read_text()
    assert text.count(old) == 1
    matrix_path = tmp_path / "matrix.yaml"
    matrix_path.write_text(text.replace(old, old + "        oci: {licenses: MIT}\n"))
    matrix = load_matrix(matrix_path, REPO / "templates", tests_dir=fixture_image_tests())
    files = {k: v.decode() for k, v in render_outputs(matrix, REPO / "templates").files.items()}
    cpu_text = files["dockerfiles/pytorch/mini-cpu/1.0/Dockerfile"]
    cpu = dockerfile_labels(cpu_text)
    ngc = dockerfile_labels(files["dockerfiles/tensorflow/mini-ngc/25.02/Dockerfile"])
    assert cpu[label_keys.OCI_LICENSES] == "MIT"                                    # the version's
    assert cpu[label_keys.OCI_DOCUMENTATION] == "https://example.org/mini/docs"     # the image's
    assert cpu[label_keys.OCI_VENDOR] == ngc[label_keys.OCI_VENDOR]                 # the defaults'
    assert ngc[label_keys.OCI_LICENSES] == "Apache-2.0" and label_keys.OCI_DOCUMENTATION not in ngc
    assert label_keys.OCI_URL not in ngc and label_keys.OCI_AUTHORS not in ngc      # unset: no label
    assert f'{label_keys.OCI_VENDOR}="Example \\"Labs\\" \\$HOME"' in cpu_text     # escaped: no build variable


def test_render_is_deterministic_across_runs_environments_and_folders(tmp_path: Path):
    first = _mini_outputs()
    assert _mini_outputs() == first
    # A separate process with another locale, time zone, hash seed and working folder.
    code = ("import sys,json;from pathlib import Path;from tests.test_render import _mini_outputs;"
            "sys.stdout.write(json.dumps({k: v.decode() for k, v in _mini_outputs().items()}))")
    env = {**os.environ, "LANG": "C", "LC_ALL": "C", "TZ": "Asia/Kolkata", "PYTHONHASHSEED": "12345",
           "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60, check=True)
    assert {k: v.encode() for k, v in json.loads(result.stdout).items()} == first


@pytest.mark.index
def test_real_project_committed_files_match_the_real_matrix(run_cli, monkeypatch):
    """The real project (not the fixture): its generated files and locks follow its matrix.yaml, and each
    pip cell's locks are what uv resolves again (the full `make check`: needs PyPI, as CI has; NGC cells,
    whose bases only BASE_MIRROR's registry can be asked, are named as not re-resolved)."""
    monkeypatch.delenv("BASE_MIRROR", raising=False)
    # The user's pip settings (~/.config/pip: this machine's local indexes), which `make lock` resolved with;
    # the session's private XDG_CONFIG_HOME would hide them. Read only: the check writes no configuration.
    monkeypatch.delenv("XDG_CONFIG_HOME")
    code, out, err = run_cli("check", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, out + err
    assert "4 re-resolved with uv" in err, err


def test_render_twice_writes_nothing_the_second_time(project: Path, run_cli):
    code, out, _ = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and out == ""
    before = snapshot(project)
    run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert snapshot(project) == before


def test_changing_one_version_changes_exactly_that_cell_and_the_catalogue(project: Path, run_cli):
    matrix = project / "matrix.yaml"
    matrix.write_text(matrix.read_text().replace("framework_version: 2.6.0a0", "framework_version: 2.6.1a0"))
    before = snapshot(project)
    code, out, _ = run_cli("render", "--matrix", str(matrix))
    assert code == 0
    after = snapshot(project)
    changed = sorted(rel for rel in after if after[rel] != before.get(rel))
    assert changed == ["dockerfiles/pytorch/pytorch-ngc/25.01/Dockerfile", "docs/images.md"]
    assert out.split() == ["wrote", "dockerfiles/pytorch/pytorch-ngc/25.01/Dockerfile", "wrote", "docs/images.md"]


def test_check_prints_a_unified_diff_on_drift(project: Path, run_cli):
    dockerfile = project / "dockerfiles/pytorch/pytorch-cpu/2.13/Dockerfile"
    pin = "      media-types=10.0.0 \\\n"
    dockerfile.write_text(dockerfile.read_text().replace(pin, pin + "      vim \\\n"))
    code, out, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1
    assert "--- a/dockerfiles/pytorch/pytorch-cpu/2.13/Dockerfile" in out
    assert "-      vim \\\n" in out
    assert "run `make render`" in err


def test_check_reports_a_generated_file_that_is_not_utf8_as_drift(project: Path, run_cli):
    """A committed generated file with bytes that are not UTF-8 is drift shown in the diff, not a traceback."""
    dockerfile = project / "dockerfiles/pytorch/pytorch-cpu/2.13/Dockerfile"
    rendered = dockerfile.read_bytes()
    dockerfile.write_bytes(b"\xff" + rendered)
    assert dockerfile.read_bytes() != rendered
    code, out, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1, err
    assert "--- a/dockerfiles/pytorch/pytorch-cpu/2.13/Dockerfile" in out and "-\\xff# GENERATED FILE" in out
    assert "run `make render`" in err


@pytest.mark.parametrize("ending", [b"\r\n", b"\r"])
def test_check_reports_a_generated_file_with_other_line_endings_as_drift(project: Path, run_cli, ending: bytes):
    """A generated file committed with CRLF (or CR) line endings is not what render writes (render rewrites it):
    check read it in text mode, saw LF, and passed. Drift now, its carriage returns shown as \\r."""
    rel = "dockerfiles/pytorch/pytorch-cpu/2.13/Dockerfile"
    dockerfile = project / rel
    rendered = dockerfile.read_bytes()
    dockerfile.write_bytes(rendered.replace(b"\n", ending))
    code, out, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1, err
    assert f"--- a/{rel}" in out and "\\r" in out
    assert "run `make render`" in err
    code, out, _ = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and out.split() == ["wrote", rel] and dockerfile.read_bytes() == rendered


def test_check_reports_a_missing_generated_file(project: Path, run_cli):
    (project / "docs" / "images.md").unlink()
    code, out, _ = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1 and "+++ b/docs/images.md" in out


@pytest.mark.parametrize("kind", ["folder", "symlink loop", "unreadable"])
def test_check_names_a_generated_file_that_cannot_be_read(project: Path, run_cli, kind: str):
    """Something at a generated file's path that cannot be read as a file: one line naming it (exit 2), never a
    traceback (an unreadable file) nor a diff that calls it missing (a folder, a symlink loop)."""
    rel = "dockerfiles/pytorch/pytorch-cpu/2.13/Dockerfile"
    path = project / rel
    path.unlink()
    if kind == "folder":
        path.mkdir()
    elif kind == "symlink loop":
        path.symlink_to(path.name)
    else:   # a file that is there and cannot be read, even by root (chmod 000 does not stop root)
        path.symlink_to("/proc/self/mem")
    code, out, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"the generated file {rel} cannot be read: " in err and "run `make render`" in err


def test_stale_dockerfile_is_reported_never_silently_deleted(project: Path, run_cli):
    stale = project / "dockerfiles/pytorch/pytorch-old/1.0/Dockerfile"
    stale.parent.mkdir(parents=True)
    stale.write_text("FROM scratch\n")
    code, _, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1 and "stale: dockerfiles/pytorch/pytorch-old/1.0/Dockerfile" in err
    code, _, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and stale.exists() and "stale: dockerfiles/pytorch/pytorch-old/1.0/Dockerfile" in err
    code, out, _ = run_cli("render", "--prune", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and not stale.exists() and not stale.parent.parent.exists()
    assert "deleted dockerfiles/pytorch/pytorch-old/1.0/Dockerfile" in out


def test_a_generated_workflow_no_render_produces_is_stale(project: Path, run_cli):
    """A workflow file stamped GENERATED that no render produces any more (a workflow the generator renamed or
    dropped: GitHub still runs it) passed `buildtool check`; now it is stale, as a Dockerfile of no cell is, and
    `render --prune` deletes it. A site's own workflow (no mark) is left alone."""
    workflows = project / ".github" / "workflows"
    head = (workflows / "nightly.yml").read_text().splitlines()[:2]
    old = workflows / "gpu-nightly.yml"
    old.write_text("\n".join([*head, "name: gpu-nightly", ""]))
    own = workflows / "site.yml"
    own.write_text("name: site\non: push\n")
    code, _, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1 and "stale: .github/workflows/gpu-nightly.yml" in err and "site.yml" not in err
    code, out, _ = run_cli("render", "--prune", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and not old.exists() and own.exists() and (workflows / "nightly.yml").exists()
    assert "deleted .github/workflows/gpu-nightly.yml" in out
    code, _, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err


def test_removing_a_cell_leaves_its_dockerfile_reported_as_stale(project: Path, run_cli):
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    start = text.index('      - version: "25.01"\n        base: nvcr.io/nvidia/pytorch')
    end = text.index("  - name: tensorflow-ngc")
    matrix.write_text(text[:start] + "\n" + text[end:])
    code, _, err = run_cli("check", "--offline", "--matrix", str(matrix))
    assert code == 1 and "stale: dockerfiles/pytorch/pytorch-ngc/25.01/Dockerfile" in err


def test_a_failure_while_writing_leaves_the_tree_as_it_was(project: Path, monkeypatch):
    matrix = load_matrix(project / "matrix.yaml", project / "templates")
    outputs = render_outputs(matrix, project / "templates", extras=(catalogue_outputs,))
    for rel in list(outputs.files)[:3]:
        (project / rel).write_text("old\n")
    (project / list(outputs.files)[3]).unlink()
    before = snapshot(project)
    real_replace = os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(render_module.os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_outputs(project, outputs)
    assert snapshot(project) == before
    assert not list(project.rglob(".render-*"))


def test_a_render_that_fails_after_a_new_cells_file_leaves_no_folder_it_made(project: Path, run_cli, monkeypatch):
    """A new cell's files go in folders the render makes: a failure rolled the files back but left those folders,
    empty. Every path (folders too) is as it was."""
    matrix = project / "matrix.yaml"
    old = '        release:\n          moving: ["{version}", latest]\n'
    text = matrix.read_text()
    at = text.index(old, text.index("  - name: pytorch-cpu\n")) + len(old)
    matrix.write_text(text[:at] + '      - version: "3.0"\n        framework_version: 2.13.0+cpu\n'
                      '        framework_requirements: ["torch==2.13.0+cpu"]\n' + text[at:])
    new_folder = project / "dockerfiles" / "pytorch" / "pytorch-cpu" / "3.0"

    def listing() -> list[str]:
        return sorted(str(p.relative_to(project)) for p in project.rglob("*") if ".git" not in p.parts)

    before = listing()
    real_mkstemp = render_module.tempfile.mkstemp
    staged_in_new_folder = []

    def failing_mkstemp(**kwargs):
        if staged_in_new_folder:    # the file after the first one staged in the new cell's folder
            raise OSError(28, "No space left on device")
        if kwargs["dir"] == new_folder:
            staged_in_new_folder.append(kwargs["dir"])
        return real_mkstemp(**kwargs)

    monkeypatch.setattr(render_module.tempfile, "mkstemp", failing_mkstemp)
    code, out, err = run_cli("render", "--matrix", str(matrix))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "nothing was written" in err
    assert staged_in_new_folder    # the render made the new cell's folder before it failed
    assert listing() == before


def test_a_failure_reading_the_old_files_leaves_no_staged_file(tmp_path: Path, monkeypatch):
    """The old contents were read after staging, outside both try blocks: a failed read left `.render-*` files."""
    outputs = render_module.Outputs(files={"a/one.txt": b"new\n", "b/two.txt": b"new\n"})
    for rel in outputs.files:
        (tmp_path / rel).parent.mkdir()
        (tmp_path / rel).write_text("old\n")
    before = snapshot(tmp_path)
    real_read = Path.read_bytes
    calls = {"n": 0}

    def failing_read(path: Path) -> bytes:
        calls["n"] += 1
        if calls["n"] > len(outputs.files):   # the reads that find what changed pass; the next (after staging) fails
            raise PermissionError(f"cannot read {path}")
        return real_read(path)

    monkeypatch.setattr(Path, "read_bytes", failing_read)
    with pytest.raises(PermissionError):
        write_outputs(tmp_path, outputs)
    monkeypatch.undo()
    assert calls["n"] > len(outputs.files)
    assert not list(tmp_path.rglob(".render-*"))
    assert snapshot(tmp_path) == before


def test_a_failure_writing_a_staged_file_leaves_no_staged_file(tmp_path: Path, monkeypatch):
    """A staged file was recorded only once written and chmodded: a full disk or a failed chmod left its
    `.render-*` file in the tree."""
    outputs = render_module.Outputs(files={"a/one.txt": b"new\n", "a/two.txt": b"new\n"})
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.txt").write_text("old\n")
    before = snapshot(tmp_path)
    real_chmod = os.chmod
    calls = {"n": 0}

    def failing_chmod(path, mode):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 2:    # the second staged file
            raise OSError(28, "No space left on device")
        return real_chmod(path, mode)

    monkeypatch.setattr(os, "chmod", failing_chmod)
    with pytest.raises(OSError):
        write_outputs(tmp_path, outputs)
    monkeypatch.undo()
    assert calls["n"] == 2
    assert not list(tmp_path.rglob(".render-*"))
    assert snapshot(tmp_path) == before


def test_a_pipe_among_the_workflows_is_not_opened_as_a_generated_file(tmp_path: Path):
    """`stale` opened every entry of .github/workflows before asking whether it is a file: a named pipe there made
    render and check wait for a writer that never comes."""
    import threading

    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "pipe.yml")
    found: list[list[str]] = []
    worker = threading.Thread(target=lambda: found.append(render_module.Outputs(files={}).stale(tmp_path)),
                              daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():     # release the blocked open before failing
        os.close(os.open(folder / "pipe.yml", os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=10)
        pytest.fail("stale() blocked opening a named pipe")
    assert found == [[]]


def test_rendering_needs_no_docker_engine(project: Path, tmp_path: Path):
    """No docker client or socket on PATH/env: render and check still work."""
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "DOCKER_HOST": "unix:///nonexistent",
           "PYTHONPATH": str(REPO)}
    for dockerfile in (project / "dockerfiles").rglob("Dockerfile"):   # the locks beside them stay
        dockerfile.unlink()
    for command in (["render"], ["check", "--offline"]):
        result = subprocess.run([sys.executable, "-m", "buildtool", *command, "--matrix", str(project / "matrix.yaml")],
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


def test_catalogue_lists_the_newest_release_of_each_cell(project: Path, run_cli):
    releases = project / "docs" / "releases"
    releases.mkdir()
    digest = "sha256:" + "ab" * 32
    for version, tags in (("0.1.0", ["2.13-0.1.0", "2.13", "latest"]), ("0.2.0", ["2.13-0.2.0", "2.13", "latest"])):
        image = {"cell": "pytorch-cpu:2.13", "tags": tags, "pinned": "x", "digest": digest,
                 "packages": {"sbom": f"r/pytorch-cpu@sha256:{'5' * 64}"} if version == "0.2.0" else None}
        (releases / f"{version}.json").write_text(json.dumps({"version": version, "images": [image]}))
    code, out, _ = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1 and "+- Released: `pytorch-cpu:2.13-0.2.0`" in out
    code, _, _ = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    text = (project / "docs" / "images.md").read_text()
    assert (f"- Released: `pytorch-cpu:2.13-0.2.0`, `pytorch-cpu:2.13`, `pytorch-cpu:latest` in release 0.2.0, "
            f"digest `{digest}` ([notes](releases/0.2.0.md))") in text
    assert (f"- SBOM (CycloneDX JSON, attached to the digest): `r/pytorch-cpu@sha256:{'5' * 64}`; print it with "
            "`buildtool sbom x`") in text
    assert text.count("- Released: not yet") == 6


def test_catalogue_shows_each_cells_platforms_and_the_released_platform_digests() -> None:
    import dataclasses

    from buildtool.render.catalogue import render_catalogue
    from tests.conftest import fixture_matrix

    both = ("linux/amd64", "linux/arm64")
    base = fixture_matrix()
    cells = tuple(dataclasses.replace(c, platforms=both, emulation_factor=4)
                  if c.key in ("pytorch-cpu:2.13", "pytorch-ngc:25.10") else c for c in base.cells)
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    released = {"pytorch-cpu:2.13": {"release": "0.1.0", "tags": ["2.13"], "pinned": "r/pytorch-cpu@sha256:9",
                                     "digest": "sha256:9", "sbom": None,
                                     "platforms": [{"platform": "linux/amd64", "digest": d1, "emulated": False},
                                                   {"platform": "linux/arm64", "digest": d2, "emulated": True}]}}
    text = render_catalogue(dataclasses.replace(base, cells=cells), released)
    assert "| cpu | linux/amd64, linux/arm64 |" in text and "| cpu | linux/amd64 |" in text   # tensorflow-cpu
    assert ("- Platforms: linux/amd64, linux/arm64 (one image index, one manifest per platform; validated "
            "linux/amd64 natively, the others under emulation (QEMU) on amd64 runners)") in text
    assert "validated each on native GPU runners of its architecture)" in text     # pytorch-ngc, a GPU cell
    assert (f"- Released platforms (one index; each platform validated on its own digest): linux/amd64 `{d1}`, "
            f"linux/arm64 `{d2}` (validated under emulation)") in text


def test_catalogue_lists_each_platforms_sbom_of_a_released_index(tmp_path: Path) -> None:
    import dataclasses

    from buildtool.contracts.releases import latest_by_cell
    from buildtool.render.catalogue import render_catalogue
    from tests.conftest import fixture_matrix

    base = fixture_matrix()
    cells = tuple(dataclasses.replace(c, platforms=("linux/amd64", "linux/arm64"), emulation_factor=4)
                  if c.key == "pytorch-cpu:2.13" else c for c in base.cells)
    d1, d2, s1 = "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "5" * 64
    image = {"cell": "pytorch-cpu:2.13", "tags": ["2.13-0.2.0"], "pinned": "r/pytorch-cpu@sha256:9",
             "digest": "sha256:9",
             "platforms": [{"platform": "linux/amd64", "digest": d1}, {"platform": "linux/arm64", "digest": d2}],
             # An index's `packages`: one section per platform (release.packages); arm64's SBOM is missing.
             "packages": {"platforms": [{"platform": "linux/amd64", "digest": d1, "sbom": f"r/pytorch-cpu@{s1}"},
                                        {"platform": "linux/arm64", "digest": d2, "sbom": None}]}}
    (tmp_path / "docs" / "releases").mkdir(parents=True)
    (tmp_path / "docs" / "releases" / "0.2.0.json").write_text(json.dumps({"version": "0.2.0", "images": [image]}))
    released = latest_by_cell(tmp_path)
    assert released["pytorch-cpu:2.13"]["sbom"] is None
    assert [p["sbom"] for p in released["pytorch-cpu:2.13"]["platforms"]] == [f"r/pytorch-cpu@{s1}", None]
    text = render_catalogue(dataclasses.replace(base, cells=cells), released)
    assert (f"- SBOMs (CycloneDX JSON, one per platform, each attached to its platform's digest): linux/amd64 "
            f"`r/pytorch-cpu@{s1}`, linux/arm64 none recorded; print one with `buildtool sbom r/pytorch-cpu@{d1}`"
            ) in text
    assert "- SBOM: none recorded for this release" not in text.split("### pytorch-cpu:2.13")[1].split("###")[0]


def test_catalogue_image_paragraph_escapes_the_use_sentence() -> None:
    """The `use` sentence the schema accepts (one line of text) reaches the image's paragraph as text: a `<!--`
    there hid the rest of docs/images.md on GitHub, a `[x](url)` made a link (the table cell was escaped already)."""
    import dataclasses

    from buildtool.matrix import values
    from buildtool.render.catalogue import render_catalogue
    from tests.conftest import fixture_matrix

    use = "Training <!-- hides the rest, [a link](https://evil.example) and <b>markup</b>"
    assert values.one_line(use) == use   # the schema's grammar of `use` accepts it
    base = fixture_matrix()
    name = base.cells[0].name
    text = render_catalogue(dataclasses.replace(base, cells=tuple(
        dataclasses.replace(c, use=use) if c.name == name else c for c in base.cells)))
    paragraph = text.split(f"\n## {name}\n\n", 1)[1].split("\n", 1)[0]
    assert paragraph == r"Training \<!-- hides the rest, \[a link\](https://evil.example) and \<b\>markup\</b\>"
    assert not re.search(r"(?<!\\)<!--", text.split("-->", 1)[1])   # only the header's own comment opens one


def test_render_that_cannot_write_a_file_says_which_in_one_line(project: Path, run_cli):
    """A folder where a generated file goes (or no permission, a full disk) ended `buildtool render` in an
    IsADirectoryError traceback; now one line names the file and why, exit 2, and nothing is written."""
    import shutil

    shutil.rmtree(project / "docs")
    (project / "docs" / "images.md").mkdir(parents=True)
    dockerfile = next(project.glob("dockerfiles/*/*/*/Dockerfile"))
    dockerfile.write_text("stale\n")
    code, out, err = run_cli("render", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and "Traceback" not in err
    assert err.strip() == ("error: cannot write docs/images.md (Is a directory); nothing was written (the tree is "
                           "as it was): make it a file this user can write (remove what is in its place) and render "
                           "again")
    assert dockerfile.read_text() == "stale\n" and not list(project.rglob(".render-*"))


def test_catalogue_that_cannot_write_it_says_so_in_one_line(project: Path, run_cli):
    """`buildtool catalogue` wrote through the same write_outputs as render without render's guard: a folder in
    the place of docs/images.md ended it in an IsADirectoryError traceback. Now render's one line, exit 2."""
    import shutil

    shutil.rmtree(project / "docs")
    (project / "docs" / "images.md").mkdir(parents=True)
    code, out, err = run_cli("catalogue", "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip() == ("error: cannot write docs/images.md (Is a directory); nothing was written (the tree is "
                           "as it was): make it a file this user can write (remove what is in its place) and render "
                           "again")
    assert not list(project.rglob(".render-*"))
