"""Locks per platform: a multi-platform cell keeps each platform's pip and apt locks in the platform's folder
(amd64/, arm64/), its readers name the platform and refuse one they cannot serve, and its one Dockerfile
selects each platform's locks with BuildKit's TARGETARCH and apt pins by the system's Debian architecture.
A cell built for the default platform alone reads and renders exactly as before. No network: the drift
test resolves against a local index of tiny pure-Python wheels (tests.fakewheels), which uv resolves for
either platform."""

from __future__ import annotations

import re
import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import locks
from buildtool.contracts.apt_lock_format import APT_LOCK, BASE_DPKG, DEB_HASHES, parse_apt_lock
from buildtool.imagebuild import aptlock, lock, lockdrift
from buildtool.imagebuild.pipconfig import HostPip
from buildtool.render.dockerfiles import TemplateError, render_cell_dockerfile, render_outputs
from tests.conftest import FIXTURE_PROJECT, REPO, fixture_matrix
from tests.fakewheels import fake_wheel

KEY = "pytorch-cpu:2.13"
BOTH = ("linux/amd64", "linux/arm64")


def _single():
    return next(c for c in fixture_matrix().cells if c.key == KEY)


def _multi():
    return replace(_single(), platforms=BOTH, emulation_factor=8)


def _folder(root: Path) -> Path:
    return (root / _single().dockerfile).parent


def _per_arch_project(tmp_path: Path, archs: tuple[str, ...] = ("amd64", "arm64")) -> Path:
    """The fixture cell's files laid out for a multi-platform cell: each arch's folder holds the committed
    locks, rewritten for that platform (the fingerprints and apt `arch` header it would have)."""
    root = tmp_path / "project"
    source = _folder(FIXTURE_PROJECT)
    target = _folder(root)
    cell = _multi()
    for arch in archs:
        platform = f"linux/{arch}"
        (target / arch).mkdir(parents=True)
        for name in locks.LOCK_FILES:
            text = (source / name).read_text()
            text = re.sub(r'(?m)^inputs = ".*"$', f'inputs = "{lock.fingerprint(cell, name, platform)}"', text)
            wheel = lock.cell_platform(cell, platform).wheel_platform
            text = re.sub(r'(?m)^platform = ".*"$', f'platform = "{wheel}"\ntarget = "{platform}"', text)
            (target / arch / name).write_text(text)
        apt = parse_apt_lock((source / APT_LOCK).read_text())
        header = {**apt.header, "inputs": aptlock.fingerprint(cell, platform), "arch": arch}
        (target / arch / APT_LOCK).write_text(
            "".join(f"# {k}: {header[k]}\n" for k in header) + "".join(f"{p}\n" for p in apt.pins()))
        for name in (BASE_DPKG, DEB_HASHES):
            shutil.copy(source / name, target / arch / name)
    return root


# -- which platform -------------------------------------------------------------------------------------

def test_a_single_platform_cell_reads_its_locks_beside_the_dockerfile_with_or_without_naming_it():
    cell = _single()
    assert lock.lock_paths(FIXTURE_PROJECT, cell) == lock.lock_paths(FIXTURE_PROJECT, cell, "linux/amd64")
    assert lock.lock_paths(FIXTURE_PROJECT, cell)[locks.FRAMEWORK_LOCK] == \
        _folder(FIXTURE_PROJECT) / "pylock.framework.toml"
    assert lock.read_locks(FIXTURE_PROJECT, cell) == lock.read_locks(FIXTURE_PROJECT, cell, "linux/amd64")
    assert aptlock.read_hashes(FIXTURE_PROJECT, cell) == aptlock.read_hashes(FIXTURE_PROJECT, cell, "linux/amd64")


@pytest.mark.parametrize("reader", [
    lambda root, cell: lock.read_locks(root, cell),
    lambda root, cell: lock.locked_versions(root, cell),
    lambda root, cell: lock.lock_paths(root, cell),
    lambda root, cell: aptlock.read(root, cell),
    lambda root, cell: aptlock.read_hashes(root, cell),
    lambda root, cell: aptlock.paths(root, cell),
], ids=["read_locks", "locked_versions", "lock_paths", "aptlock.read", "aptlock.read_hashes", "aptlock.paths"])
def test_a_multi_platform_cell_read_without_a_platform_is_refused_naming_the_cell(tmp_path: Path, reader):
    root = _per_arch_project(tmp_path)
    with pytest.raises(UserError, match=r"^pytorch-cpu:2.13 is built for linux/amd64, linux/arm64: name the "
                                        r"platform whose locks to read"):
        reader(root, _multi())


@pytest.mark.parametrize("platform, message", [
    ("linux/riscv64", r"^pytorch-cpu:2.13: unknown platform 'linux/riscv64'; one of linux/amd64, linux/arm64$"),
    ("linux/arm64", r"^pytorch-cpu:2.13 is not built for linux/arm64 \(its platforms: linux/amd64\); it has no "
                    r"locks for it$"),
])
def test_a_platform_the_cell_is_not_built_for_is_refused_by_name(platform: str, message: str):
    with pytest.raises(UserError, match=message):
        lock.read_locks(FIXTURE_PROJECT, _single(), platform)
    with pytest.raises(UserError, match=message):
        aptlock.read_hashes(FIXTURE_PROJECT, _single(), platform)


def test_each_platform_reads_its_own_folder(tmp_path: Path):
    root = _per_arch_project(tmp_path)
    cell = _multi()
    for arch in ("amd64", "arm64"):
        assert lock.lock_paths(root, cell, f"linux/{arch}")[locks.TOOLS_LOCK] == \
            _folder(root) / arch / "pylock.tools.toml"
        assert aptlock.read(root, cell, f"linux/{arch}").header["arch"] == arch
        assert aptlock.read_hashes(root, cell, f"linux/{arch}")
    assert lock.locked_versions(root, cell, "linux/arm64")["torch"] == "2.13.0+cpu"
    assert lock.check_cell(root, cell) == []
    assert aptlock.check_cell(root, cell) == []


def test_a_missing_platform_lock_is_named(tmp_path: Path):
    root = _per_arch_project(tmp_path, archs=("amd64",))
    cell = _multi()
    rel = f"{Path(cell.dockerfile).parent}/arm64"
    with pytest.raises(UserError, match=rf"^{rel}/pylock.framework.toml is missing; run `make lock "
                                        r"FRAMEWORK=pytorch-cpu:2.13`$"):
        lock.read_locks(root, cell, "linux/arm64")
    with pytest.raises(UserError, match=rf"^{rel}/{DEB_HASHES} is missing"):
        aptlock.read_hashes(root, cell, "linux/arm64")
    assert lock.check_cell(root, cell) == [f"{rel}/pylock.framework.toml is missing; run `make lock FRAMEWORK={KEY}`"]
    assert aptlock.check_cell(root, cell) == [f"{rel}/apt.lock is missing; run `make lock FRAMEWORK={KEY}`"]


def test_a_lock_of_another_platform_in_a_platforms_folder_is_refused(tmp_path: Path):
    root = _per_arch_project(tmp_path)
    cell = _multi()
    folder = _folder(root)
    rel = f"{Path(cell.dockerfile).parent}/arm64"
    # amd64's files copied over arm64's: their headers name amd64.
    for name in (*locks.LOCK_FILES, APT_LOCK):
        shutil.copy(folder / "amd64" / name, folder / "arm64" / name)
    with pytest.raises(UserError, match=rf"^{rel}/pylock.framework.toml is a lock for x86_64-manylinux_2_28, not "
                                        r"aarch64-manylinux_2_28; run `make lock FRAMEWORK=pytorch-cpu:2.13`$"):
        lock.read_locks(root, cell, "linux/arm64")
    with pytest.raises(UserError, match=rf"^{rel}/apt.lock was resolved for amd64, not arm64; run `make lock"):
        aptlock.read(root, cell, "linux/arm64")
    assert any(p.startswith(f"{rel}/apt.lock was resolved for amd64") for p in aptlock.check_cell(root, cell))
    # Without the platform it names, it is refused as well (a lock says which platform it is for).
    for name in locks.LOCK_FILES:
        path = folder / "arm64" / name
        path.write_text(re.sub(r"(?m)^platform = .*\n", "", path.read_text()))
    assert lock.check_cell(root, cell) == [f"{rel}/pylock.framework.toml is a lock for no named platform, not "
                                           f"aarch64-manylinux_2_28; run `make lock FRAMEWORK={KEY}`"]


def test_fingerprints_differ_per_platform_and_the_default_platforms_are_unchanged():
    single, multi = _single(), _multi()
    for part in locks.LOCK_FILES:
        assert lock.fingerprint(multi, part, "linux/amd64") == lock.fingerprint(single, part)
        assert lock.fingerprint(multi, part, "linux/arm64") != lock.fingerprint(single, part)
    assert aptlock.fingerprint(multi, "linux/amd64") == aptlock.fingerprint(single)
    assert aptlock.fingerprint(multi, "linux/arm64") != aptlock.fingerprint(single)


# -- render ------------------------------------------------------------------------------------------------

def test_single_platform_dockerfiles_render_byte_identical_to_the_committed_ones():
    """Every cell of the real matrix built for linux/amd64 alone renders as committed (no TARGETARCH)."""
    from buildtool.matrix.loader import load_matrix

    matrix = load_matrix(REPO / "matrix.yaml", REPO / "templates", display="matrix.yaml")
    outputs = render_outputs(matrix, REPO / "templates", root=REPO)
    singles = [c for c in matrix.cells if not c.multi_platform]
    assert singles
    for cell in singles:
        text = outputs.files[cell.dockerfile].decode()
        assert text == (REPO / cell.dockerfile).read_text(), cell.key
        assert "TARGETARCH" not in text


def test_a_multi_platform_dockerfile_selects_locks_by_targetarch_and_apt_pins_by_architecture(tmp_path: Path):
    root = _per_arch_project(tmp_path)
    text = render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)
    # Declared in the native stages that fetch the .debs and install the locks (tests/test_native_installs.py);
    # the apt step reads the system's own architecture, so the build machine's stage can run the same step.
    assert text.count("ARG TARGETARCH\n") == 3
    case = re.search(r'case "\$\{arch\}" in \\\n(.*?)esac > "/run/\$\{arch\}.sha256"', text, re.S)
    assert case, text
    body = case.group(1)
    pins = parse_apt_lock((_folder(root) / "arm64" / APT_LOCK).read_text()).pins()
    for arch in ("amd64", "arm64"):
        branch = re.search(rf"(?s)        {arch}\) printf '%s\\n' \\\n(.*?);;", body)
        assert branch, arch
        assert all(f"'{pin} " in branch.group(1) for pin in pins)
    assert ('*) echo "ERROR: no apt pins for architecture ${arch}: this cell is built for linux/amd64 '
            'linux/arm64 (matrix.yaml platforms)" >&2; exit 1 ;;') in body
    for name in locks.LOCK_FILES:
        for arch in ("amd64", "arm64"):
            assert f"--mount=type=bind,source={arch}/{name},target=/run/lock/{arch}/{name}" in text
        assert f'sed -f /run/secrets/lock-urls "/run/lock/${{TARGETARCH}}/{name}"' in text
        assert f"-r /run/{name} \\\n" in text
        assert (f'if [ ! -f "/run/lock/${{TARGETARCH}}/{name}" ]; then echo "ERROR: no {name} for '
                f'TARGETARCH=${{TARGETARCH}}') in text
    assert "source=pylock.framework.toml" not in text


def test_a_platform_without_its_apt_lock_renders_a_branch_that_stops_its_build(tmp_path: Path):
    root = _per_arch_project(tmp_path, archs=("amd64",))
    text = render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)
    assert ('arm64) echo "ERROR: arm64/apt.lock is missing beside this Dockerfile; run make lock '
            'FRAMEWORK=pytorch-cpu:2.13" >&2; exit 1 ;;') in text
    assert "amd64) printf" in text


def test_an_apt_lock_of_another_arch_is_refused_at_render(tmp_path: Path):
    root = _per_arch_project(tmp_path)
    folder = _folder(root)
    shutil.copy(folder / "amd64" / APT_LOCK, folder / "arm64" / APT_LOCK)
    with pytest.raises(TemplateError, match=r"arm64/apt.lock was resolved for amd64, not arm64; run `make lock"):
        render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)


@pytest.mark.tools("hadolint")
def test_the_multi_platform_dockerfile_passes_hadolint(tmp_path: Path):
    import subprocess

    hadolint = shutil.which("hadolint")
    assert hadolint

    root = _per_arch_project(tmp_path)
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root))
    run = subprocess.run([hadolint, "--config", str(REPO / ".hadolint.yaml"), str(dockerfile)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


# -- make lock and the drift check, per platform --------------------------------------------------------

WHEELS = {"sympy": {"1.14.0": ["mpmath<1.4,>=1.1.0"]}, "mpmath": {"1.3.0": []},
          "tensorboard": {"2.21.0": []}, "torch-tb-profiler": {"0.4.3": ["tensorboard"]}, "pip": {"26.3": []}}


@pytest.fixture
def host(tmp_path: Path) -> HostPip:
    (tmp_path / "files").mkdir()
    for name, versions in WHEELS.items():
        links = []
        for version, requires in versions.items():
            file, digest = fake_wheel(tmp_path / "files", name, version, requires, "py3-none-any")
            links.append(f'<a href="../../files/{file}#sha256={digest}">{file}</a>')
        (tmp_path / "simple" / name).mkdir(parents=True)
        (tmp_path / "simple" / name / "index.html").write_text(f"<html><body>{''.join(links)}</body></html>")
    return HostPip(index_url=f"file://{tmp_path / 'simple'}")


def _small(cell):
    return replace(cell, framework_requirements=("sympy==1.14.0",), extra_index_urls=(), index_url=None)


def test_make_lock_writes_each_platforms_locks_and_drift_is_checked_per_platform(tmp_path: Path, host: HostPip):
    root = tmp_path / "root"
    cell = _small(_multi())
    lock.lock_cells(root, [cell], {}, (), log=lambda line: None, host=host)
    folder = _folder(root)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("pylock.*.toml")) == [
        "amd64/pylock.framework.toml", "amd64/pylock.tools.toml", "arm64/pylock.framework.toml",
        "arm64/pylock.tools.toml"]
    table = tomllib.loads((folder / "arm64" / "pylock.framework.toml").read_text())["tool"]["dl-images"]
    assert (table["python"], table["platform"], table["target"]) == ("3.11", "aarch64-manylinux_2_28", "linux/arm64")
    assert lock.check_cell(root, cell) == []
    assert lockdrift.cell_drift(root, cell, host, log=lambda line: None) == []
    # A hand edit in one platform's lock is drift of that file.
    path = folder / "arm64" / "pylock.framework.toml"
    path.write_text(re.sub(r'(?ms)^\[\[packages\]\]\nname = "mpmath"\n.*?(?=^\[|\Z)', "", path.read_text()))
    problems = lockdrift.cell_drift(root, cell, host, log=lambda line: None)
    assert problems == [f"{Path(cell.dockerfile).parent}/arm64/pylock.framework.toml: mpmath deleted by hand (the "
                        f"resolution needs mpmath 1.3.0); run `make lock FRAMEWORK={KEY}`"]


def test_make_lock_of_a_single_platform_cell_writes_beside_the_dockerfile_as_before(tmp_path: Path, host: HostPip):
    root = tmp_path / "root"
    cell = _small(_single())
    lock.lock_cells(root, [cell], {}, (), log=lambda line: None, host=host)
    folder = _folder(root)
    assert sorted(p.name for p in folder.iterdir()) == ["pylock.framework.toml", "pylock.tools.toml"]
    table = tomllib.loads((folder / "pylock.framework.toml").read_text())["tool"]["dl-images"]
    assert (table["python"], table["platform"]) == ("3.11", "x86_64-manylinux_2_28") and "target" not in table


# -- the base of each platform ------------------------------------------------------------------------------

class _Registry:
    """RegistryClient's two reads platform_base uses, answering from a dict of documents."""

    documents: dict[str, tuple[dict, str]] = {}

    def __init__(self, host: str):
        self.host = host

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        import json

        document, media_type = self.documents[ref]
        return json.dumps(document).encode(), media_type, "sha256:" + "d" * 64

    def get_blob(self, repo: str, digest: str, limit: int | None = None) -> bytes:
        import json

        return json.dumps(self.documents[digest][0]).encode()


def test_each_platform_resolves_in_its_own_image_of_the_base(monkeypatch):
    from buildtool.common.errors import FailedError
    from buildtool.registry import client

    index = {"manifests": [
        {"digest": "sha256:" + "a" * 64, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": "sha256:" + "b" * 64, "platform": {"os": "linux", "architecture": "arm64"}},
    ]}
    monkeypatch.setattr(client, "RegistryClient", _Registry)
    monkeypatch.setattr(_Registry, "documents", {
        "bookworm-slim": (index, client.OCI_INDEX),
        "amd64-only": ({"manifests": index["manifests"][:1]}, client.OCI_INDEX),
        "single": ({"config": {"digest": "cfg"}}, "application/vnd.oci.image.manifest.v1+json"),
        "cfg": ({"os": "linux", "architecture": "amd64"}, ""),
    })
    base = "127.0.0.1:5000/library/debian"
    assert aptlock.platform_base(f"{base}:bookworm-slim", "linux/arm64") == f"{base}@sha256:{'b' * 64}"
    assert aptlock.platform_base(f"{base}:bookworm-slim", "linux/amd64") == f"{base}@sha256:{'a' * 64}"
    with pytest.raises(FailedError, match=r"^the base 127.0.0.1:5000/library/debian:amd64-only has no linux/arm64 "
                                          r"image \(its index lists linux/amd64\); mirror the base for linux/arm64"):
        aptlock.platform_base(f"{base}:amd64-only", "linux/arm64")
    with pytest.raises(FailedError, match=r"^the base 127.0.0.1:5000/library/debian:single is one linux/amd64 "
                                          r"image, not an index with linux/arm64"):
        aptlock.platform_base(f"{base}:single", "linux/arm64")
    assert aptlock.platform_base(f"{base}:single", "linux/amd64") == f"{base}@sha256:{'d' * 64}"


def test_the_rendered_apt_selection_runs_each_archs_pins_and_stops_an_unknown_architecture(tmp_path: Path):
    """The `case` of the rendered debs stage itself, run by bash as BuildKit's RUN would, for ARCH: each
    architecture's pins, each with the sha256 its debs.sha256 records."""
    import subprocess

    from buildtool.contracts.apt_lock_format import parse_deb_hashes

    root = _per_arch_project(tmp_path, archs=("amd64", "arm64"))
    text = render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)
    found = re.search(r'(?s)(case "\$\{arch\}" in .*?esac)', text)
    assert found
    script = found.group(1).replace("\\\n", "")  # the Dockerfile joins continued lines

    def run(arch: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", "arch": arch},
                              capture_output=True, text=True, timeout=30)

    pins = parse_apt_lock((_folder(root) / "arm64" / APT_LOCK).read_text()).pins()
    hashes = parse_deb_hashes((_folder(root) / "arm64" / DEB_HASHES).read_text(), DEB_HASHES)
    for arch in ("amd64", "arm64"):
        done = run(arch)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [f"{pin} {hashes[pin]}" for pin in pins]
    for arch in ("riscv64", ""):
        done = run(arch)
        assert done.returncode == 1
        assert done.stderr == (f"ERROR: no apt pins for architecture {arch}: this cell is built for linux/amd64 "
                               "linux/arm64 (matrix.yaml platforms)\n")


def test_apt_drift_re_resolves_each_platform_in_its_own_base_and_names_its_file(tmp_path: Path, monkeypatch):
    root = _per_arch_project(tmp_path)
    cell = _multi()
    asked: list[tuple[str, str | None]] = []
    lock_entries = parse_apt_lock((_folder(root) / "amd64" / APT_LOCK).read_text()).entries
    base = dict(line.split("=", 1) for line in (_folder(root) / "amd64" / BASE_DPKG).read_text().splitlines()
                if line and not line.startswith("#"))

    def probe(base_ref: str, install: list[str], prefs: str = "", platform: str | None = None) -> aptlock.Probe:
        asked.append((base_ref, platform))
        plan = dict(lock_entries)
        if platform == "linux/arm64":
            plan["libfoo1"] = "1.0-1"   # what arm64's closure needs and its lock lacks
        arch = platform.split("/")[1] if platform else "amd64"
        return aptlock.Probe(arch=arch, base=base, plan=plan, pinned=plan,
                             served={(n, v) for n, v in plan.items()})

    monkeypatch.setattr(aptlock, "run_probe", probe)
    monkeypatch.setattr(aptlock, "platform_base", lambda ref, platform: f"{ref}@{platform.split('/')[1]}")
    problems = aptlock.cell_drift(root, cell, "mirror/debian:bookworm-slim", log=lambda line: None)
    assert asked == [("mirror/debian:bookworm-slim@amd64", "linux/amd64"),
                     ("mirror/debian:bookworm-slim@arm64", "linux/arm64")]
    assert problems == [f"{Path(cell.dockerfile).parent}/arm64/apt.lock: libfoo1 deleted by hand (the resolution "
                        f"installs libfoo1 1.0-1); run `make lock FRAMEWORK={KEY}`"]
