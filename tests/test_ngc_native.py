"""Multi-platform NGC cells (issue 38): the base is asked on each platform (`make lock`), the tools are
installed by uv on the build machine into that machine's image of the same base and only the files that adds
are copied into the target's (no install under QEMU), every ELF file of them checked to be the target's; the
stand-in of such a cell is an index with one image per platform, its requirements installed natively too.
Tests on the lock's inputs, the rendered Dockerfile (its stages; its ELF check run for real) and the stand-in."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys, locks, platforms
from buildtool.imagebuild import bases, lock
from buildtool.render.dockerfiles import TemplateError, render_cell_dockerfile, wheel_platforms
from tests.conftest import REPO, fixture_matrix
from tests.test_native_installs import _runs, _stages

BOTH = ("linux/amd64", "linux/arm64")
FIXTURE_PROJECT = REPO / "tests/fixtures/project"


def _ngc(**changes: Any):
    cell = next(c for c in fixture_matrix().cells if c.key == "pytorch-ngc:25.10")
    return replace(cell, platforms=BOTH, emulation_factor=8, **changes)


def _project(tmp_path: Path, glibc: dict[str, str | None] | None = None) -> Path:
    """The fixture NGC cell's pylock.tools.toml laid out per architecture, each with the table `make lock` writes
    for that platform (`glibc` the base's, None: that key left out)."""
    glibc = glibc if glibc is not None else {"amd64": "2.36", "arm64": "2.36"}
    cell = _ngc()
    source = (FIXTURE_PROJECT / cell.dockerfile).parent / locks.TOOLS_LOCK
    root = tmp_path / "project"
    for arch, version in glibc.items():
        platform = f"linux/{arch}"
        folder = (root / cell.dockerfile).parent / arch
        folder.mkdir(parents=True)
        text = source.read_text()
        text = re.sub(r'(?m)^inputs = ".*"$', f'inputs = "{lock.fingerprint(cell, locks.TOOLS_LOCK, platform)}"',
                      text)
        wheel = lock.cell_platform(cell, platform).wheel_platform
        text = re.sub(r'(?m)^platform = ".*"$', f'platform = "{wheel}"\ntarget = "{platform}"', text)
        if version is not None:
            text += f'glibc = "{version}"\n'     # the table is the file's last
        (folder / locks.TOOLS_LOCK).write_text(text)
    return root


def _render(tmp_path: Path, **kw: Any) -> str:
    return render_cell_dockerfile(fixture_matrix(), _ngc(), REPO / "templates", root=_project(tmp_path, **kw))


# -- the base, asked on each platform -------------------------------------------------------------------------

def _facts(python: str = "3.12", glibc: str = "2.39") -> lock.BaseFacts:
    return lock.BaseFacts(python=python, packages={"torch": "2.9.0a0"}, glibc=glibc)


def test_the_base_is_asked_on_each_platform_of_a_multi_platform_cell() -> None:
    asked: list[tuple[str, ...]] = []

    def ask(*args: str) -> lock.BaseFacts:
        asked.append(args)
        return _facts()

    found = lock.platform_bases(_ngc(), "mirror/nvidia/pytorch:25.10-py3", ask)
    assert asked == [("mirror/nvidia/pytorch:25.10-py3", "linux/amd64"), ("mirror/nvidia/pytorch:25.10-py3",
                                                                          "linux/arm64")]
    assert set(found) == set(BOTH)
    # A single-platform cell asks the base as it is, once.
    asked.clear()
    single = replace(_ngc(), platforms=platforms.DEFAULT)
    assert list(lock.platform_bases(single, "mirror/p:1", ask)) == ["linux/amd64"] and asked == [("mirror/p:1",)]


def test_bases_with_different_pythons_are_refused_naming_each() -> None:
    answers = {"linux/amd64": _facts("3.12"), "linux/arm64": _facts("3.11")}
    with pytest.raises(UserError) as caught:
        lock.platform_bases(_ngc(), "mirror/p:1", lambda ref, platform: answers[platform])
    assert str(caught.value) == ("pytorch-ngc:25.10: the base mirror/p:1 has Python 3.12 on linux/amd64, 3.11 on "
                                 "linux/arm64; a cell built for several platforms needs one Python version on all of "
                                 "them (its tools are installed natively for each)")


def test_a_base_that_names_no_glibc_is_refused_naming_the_platform() -> None:
    answers = {"linux/amd64": _facts(), "linux/arm64": _facts(glibc="")}
    with pytest.raises(UserError, match=r"^pytorch-ngc:25.10: the base mirror/p:1 names no glibc version on "
                                        r"linux/arm64, so its wheels' platform is unknown"):
        lock.platform_bases(_ngc(), "mirror/p:1", lambda ref, platform: answers[platform])


def test_the_base_probe_reports_this_pythons_glibc() -> None:
    done = subprocess.run([sys.executable, "-c", lock.BASE_PROBE], capture_output=True, text=True, timeout=60)
    facts = lock.parse_base_probe(done.stdout, ref="here", standin=False)
    libc = subprocess.run(["getconf", "GNU_LIBC_VERSION"], capture_output=True, text=True).stdout.split()[1]
    assert facts.glibc == ".".join(libc.split(".")[:2])
    assert facts.python == "{}.{}".format(*sys.version_info[:2])


def test_a_multi_platform_ngc_lock_records_its_bases_glibc() -> None:
    def table(cell: Any, platform: str | None) -> dict[str, str]:
        text = lock._table(cell, _facts(glibc="2.39"), platform, locks.TOOLS_LOCK, "3.12")
        return dict(tomllib.loads(text)["tool"]["dl-images"])

    found = table(_ngc(), "linux/arm64")
    assert (found["glibc"], found["platform"], found["target"]) == ("2.39", "aarch64-manylinux_2_28", "linux/arm64")
    # A single-platform NGC lock names none: it installs on the target, where uv reads the machine itself.
    assert "glibc" not in table(replace(_ngc(), platforms=platforms.DEFAULT), None)


# -- the Dockerfile ------------------------------------------------------------------------------------------

def test_the_tools_are_installed_on_the_build_machine_and_the_image_only_copies_what_that_added(
        tmp_path: Path) -> None:
    text = _render(tmp_path)
    assert text.index("ARG BUILD_BASE_IMAGE=") < text.index("\nFROM ")
    stages = _stages(text)
    assert list(stages) == ["base", "build-base", "uv", "site-tools", "final"]
    assert stages["build-base"].startswith("FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS build-base\n")
    assert stages["site-tools"].startswith("FROM build-base AS site-tools\n")
    [install] = [r for r in _runs(stages["site-tools"]) if "uv pip install" in r]
    # Into the base's own Python, under its pip constraints, every locked file written again for the target.
    assert '--python "$(command -v python)" --reinstall' in install and "--require-hashes" in install
    assert '--python-platform "${wheel_platform}"' in install and "--python-version" not in install
    assert 'UV_CONSTRAINT="$PIP_CONSTRAINT"' in install and "uv pip install --dry-run --offline --no-deps" in install
    assert "aarch64-manylinux_2_36" in install and "x86_64-manylinux_2_36" in install
    assert "mkdir /site && env -C / xargs -0 -r cp -a --parents -t /site < /run/added" in install
    final = stages["final"]
    assert "COPY --from=site-tools /site/ /\n" in final
    assert _runs(final) == [r for r in _runs(final) if "python" not in r and "uv" not in r]
    assert "ARG TARGETARCH" not in final


def test_the_wheel_platform_is_each_bases_glibc_as_its_lock_records_it(tmp_path: Path) -> None:
    root = _project(tmp_path, {"amd64": "2.39", "arm64": "2.35"})
    assert wheel_platforms(root, _ngc()) == {"amd64": "x86_64-manylinux_2_39", "arm64": "aarch64-manylinux_2_35"}


def test_a_lock_without_its_bases_glibc_is_refused_at_render(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"arm64/pylock.tools.toml names no glibc of its base \(`glibc` in "
                                            r"\[tool.dl-images\]\), so the wheels' platform is unknown; run `make "
                                            r"lock FRAMEWORK=pytorch-ngc"):
        _render(tmp_path, glibc={"amd64": "2.36", "arm64": None})


def test_a_platform_without_its_lock_stops_that_platforms_build(tmp_path: Path) -> None:
    text = _render(tmp_path, glibc={"amd64": "2.36"})
    [install] = [r for r in _runs(_stages(text)["site-tools"]) if "uv pip install" in r]
    assert "arm64) wheel_platform" not in install
    assert ('if [ ! -f "/run/lock/${TARGETARCH}/pylock.tools.toml" ]; then echo "ERROR: no pylock.tools.toml for '
            'TARGETARCH=${TARGETARCH}') in install


def _elf_check(text: str) -> str:
    [install] = [r for r in _runs(_stages(text)["site-tools"]) if "uv pip install" in r]
    return re.search(r"(python -c 'import sys; want = .*?') /run/added", install).group(1)


@pytest.mark.parametrize(("machine", "fails"), [(62, False), (183, True)])
def test_the_elf_check_stops_the_build_on_a_file_of_another_machine(tmp_path: Path, machine: int,
                                                                    fails: bool) -> None:
    """Run as rendered, on real files: this machine's python3 and ls (x86-64 ELF) and a text file."""
    if platforms.host().name != "linux/amd64":
        pytest.fail("this test names x86-64 files; run it on an amd64 machine")
    listing = tmp_path / "added"
    text_file = tmp_path / "module.py"
    text_file.write_text("x = 1\n")
    files = [shutil.which("ls"), str(Path(sys.executable).resolve()), str(text_file)]
    listing.write_bytes(b"\0".join(str(f).encode() for f in files) + b"\0")
    done = subprocess.run(["bash", "-c", f"{_elf_check(_render(tmp_path))} {listing} {machine}"],
                          capture_output=True, text=True, timeout=60)
    if fails:
        assert done.returncode == 1
        assert done.stderr.startswith("ERROR: not built for ELF machine 183 (TARGETARCH): ")
        assert shutil.which("ls") in done.stderr and str(text_file) not in done.stderr
    else:
        assert done.returncode == 0, done.stderr


def test_the_elf_machines_are_the_psabi_ones() -> None:
    assert platforms.get("linux/amd64").elf_machine == 62 and platforms.get("linux/arm64").elf_machine == 183


def test_a_single_platform_ngc_cell_still_installs_on_its_base(tmp_path: Path) -> None:
    single = replace(_ngc(), platforms=platforms.DEFAULT)
    assert not single.native_installs and _ngc().native_installs
    text = render_cell_dockerfile(fixture_matrix(), single, REPO / "templates", root=FIXTURE_PROJECT)
    assert "BUILDPLATFORM" not in text and "uv pip install" in _stages(text)["final"]


# -- the stand-in ---------------------------------------------------------------------------------------------

def test_a_multi_platform_stand_in_installs_its_requirements_on_the_build_machine() -> None:
    cell = _ngc()
    text = bases._standin_index_dockerfile(cell, "127.0.0.1:5000/docker.io/library/debian:bookworm-slim",
                                           "uv==0.13.9 --hash=sha256:" + "0" * 64)
    stages = _stages(text)
    assert list(stages) == ["build-python", "final"]
    assert stages["build-python"].startswith("FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS build-python")
    [install] = [r for r in _runs(stages["build-python"]) if "uv pip install" in r]
    assert '--python-platform "${machine}-manylinux_${glibc}" "${reqs[@]}"' in install
    assert ("amd64) machine=x86_64; reqs=(torch==2.13.0+cpu) ;; arm64) machine=aarch64; reqs=(torch==2.13.0+cpu) ;;"
            in install)
    # On the target only apt runs; the venv is copied in.
    final = stages["final"]
    assert [r.split()[1] for r in _runs(final)] == ["apt-get"]
    assert "COPY --from=build-python /usr/local/standin /usr/local/standin" in final
    assert f'{label_keys.STANDIN}="true"' in final


def test_the_stand_in_selects_its_machine_by_targetarch_and_stops_on_another() -> None:
    text = bases._standin_index_dockerfile(_ngc(), "m/debian:bookworm-slim", "uv==1 --hash=sha256:" + "0" * 64)
    [install] = [r for r in _runs(_stages(text)["build-python"]) if "uv pip install" in r]
    case = re.search(r"(case .*? esac)", install).group(1)
    for arch, machine in (("amd64", "x86_64"), ("arm64", "aarch64")):
        done = subprocess.run(["bash", "-c", case + ' && echo "$machine"'], env={"TARGETARCH": arch},
                              capture_output=True, text=True, timeout=30)
        assert done.stdout == f"{machine}\n"
    done = subprocess.run(["bash", "-c", case], env={"TARGETARCH": "riscv64"}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and done.stderr == "ERROR: no stand-in for riscv64\n"


def test_the_debian_base_of_a_multi_platform_stand_in_holds_each_platform() -> None:
    assert bases.debian_platforms(_ngc()) == BOTH


# -- the matrix: a stand-in's requirements of one platform --------------------------------------------------

def _matrix_with(tmp_path: Path, version_lines: str):
    """The fixture matrix with `version_lines` added to pytorch-ngc 25.10 (8 spaces in, as its keys)."""
    from buildtool.matrix.loader import load_matrix
    from tests.conftest import fixture_image_tests

    text = (FIXTURE_PROJECT / "matrix.yaml").read_text()
    anchor = '        base: nvcr.io/nvidia/pytorch:25.10-py3\n'
    assert anchor in text
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace(anchor, anchor + version_lines, 1))
    return load_matrix(path, REPO / "templates", display="matrix.yaml", tests_dir=fixture_image_tests())


ARM64_TORCH = ('        platforms: [linux/amd64, linux/arm64]\n'
               '        validate: {emulation_factor: 8}\n'
               '        standin:\n'
               '          platform_requirements:\n'
               '            linux/arm64: ["torch==2.13.0"]\n')


def test_a_version_adds_one_platforms_stand_in_requirements_to_its_images(tmp_path: Path) -> None:
    cells = {c.key: c for c in _matrix_with(tmp_path, ARM64_TORCH).cells}
    standin = cells["pytorch-ngc:25.10"].standin
    assert standin is not None and standin.base == "docker.io/library/debian:bookworm-slim"
    assert standin.requirements_for("linux/arm64") == ["torch==2.13.0"]
    assert standin.requirements_for("linux/amd64") == ["torch==2.13.0+cpu"]
    assert bases.standin_framework_version(cells["pytorch-ngc:25.10"], "linux/arm64") == "2.13.0"
    assert bases.standin_framework_version(cells["pytorch-ngc:25.10"], "linux/amd64") == "2.13.0+cpu"
    # The other version keeps the image's stand-in, whole.
    assert cells["pytorch-ngc:25.01"].standin.requirements_for("linux/amd64") == ["torch==2.13.0+cpu"]
    text = bases._standin_index_dockerfile(cells["pytorch-ngc:25.10"], "m/debian:bookworm-slim",
                                           "uv==1 --hash=sha256:" + "0" * 64)
    assert "amd64) machine=x86_64; reqs=(torch==2.13.0+cpu) ;; arm64) machine=aarch64; reqs=(torch==2.13.0) ;;" \
        in text
    assert f"{label_keys.STANDIN_FRAMEWORK}=" not in text  # each platform's, measured (test_the_framework_label_...)


def test_requirements_for_a_platform_the_cell_is_not_built_for_are_refused(tmp_path: Path) -> None:
    from buildtool.common.errors import MatrixError

    lines = ARM64_TORCH.replace("        platforms: [linux/amd64, linux/arm64]\n", "")
    with pytest.raises(MatrixError) as caught:
        _matrix_with(tmp_path, lines.replace("        validate: {emulation_factor: 8}\n", ""))
    assert str(caught.value).endswith("standin.platform_requirements.linux/arm64: linux/arm64 is not one of the "
                                      "cell's platforms (linux/amd64); add it to `platforms:` or remove its "
                                      "requirements")


def test_an_unknown_platform_in_a_stand_ins_requirements_is_refused(tmp_path: Path) -> None:
    from buildtool.common.errors import MatrixError

    with pytest.raises(MatrixError, match=r"platform_requirements.*unknown platform 'linux/riscv64'"):
        _matrix_with(tmp_path, ARM64_TORCH.replace("linux/arm64: [", "linux/riscv64: ["))


def test_a_stand_in_without_a_base_after_merging_is_refused(tmp_path: Path) -> None:
    from buildtool.common.errors import MatrixError

    text = (FIXTURE_PROJECT / "matrix.yaml").read_text().replace(
        "      base: docker.io/library/debian:bookworm-slim\n      requirements: [\"torch==2.13.0+cpu\"]\n",
        "      requirements: [\"torch==2.13.0+cpu\"]\n", 1)
    path = tmp_path / "m.yaml"
    path.write_text(text)
    from buildtool.matrix.loader import load_matrix
    from tests.conftest import fixture_image_tests

    with pytest.raises(MatrixError, match=r"standin.base: required key is missing"):
        load_matrix(path, REPO / "templates", display="matrix.yaml", tests_dir=fixture_image_tests())


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class _FakeMirror:
    """The registry side of `_standin_index`: which platforms the stand-in tag holds, and what was made."""

    def __init__(self, holds: list[str]) -> None:
        from buildtool.registry.image_index import Child

        self.child = Child
        self.holds = {p: Child(p, f"sha256:{'a' * 63}{i}", OCI_MANIFEST, 1, {})
                      for i, p in enumerate(holds)}
        self.built: list[tuple[str, str, dict[str, str]]] = []
        self.index: list[str] | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from buildtool.imagebuild import aptlock, base_index, multiplatform
        from buildtool.registry import image_index

        monkeypatch.setattr(base_index, "read_children", lambda client, repo, tag: dict(self.holds))
        monkeypatch.setattr(bases.platforms, "binfmt_problem", lambda name: None)
        monkeypatch.setattr(aptlock, "platform_base", lambda ref, platform: f"{ref}@{platform}")
        monkeypatch.setattr(bases, "_build_standin", lambda cell, text, args, tag, log, platform=None,
                            measure_framework=False: self.built.append((platform, args["BASE_IMAGE"],
                                                                        measure_framework)))
        monkeypatch.setattr(bases, "push_verified", lambda ref, log: f"sha256:{'b' * 64}")
        monkeypatch.setattr(multiplatform, "child_of", lambda client, repo, tag, platform:
                            self.child(platform, f"sha256:{'c' * 64}", OCI_MANIFEST, 1, {}))
        monkeypatch.setattr(image_index, "put_index", lambda client, repo, tag, children:
                            setattr(self, "index", [c.platform for c in children]) or f"sha256:{'d' * 64}")


def test_a_stand_in_index_holding_every_platform_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mirror = _FakeMirror(list(BOTH))
    mirror.install(monkeypatch)
    results = bases._standin_index(_ngc(), "127.0.0.1:5000/nvidia/pytorch:25.10-py3", "127.0.0.1:5000", force=False,
                                   log=lambda line: None, log_dir=tmp_path, templates=REPO / "templates")
    assert [(r.platform, r.action) for r in results] == [("linux/amd64", "present"), ("linux/arm64", "present")]
    assert mirror.built == [] and mirror.index is None


def test_a_stand_in_lacking_a_platform_is_made_again_whole_each_platform_on_its_own_base(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A single-platform stand-in of an earlier recipe (amd64 only) becomes the index over both; each platform's
    image is built FROM that platform's Debian image and labelled with the framework version it reports."""
    cells = {c.key: c for c in _matrix_with(tmp_path, ARM64_TORCH).cells}
    mirror = _FakeMirror(["linux/amd64"])
    mirror.install(monkeypatch)
    results = bases._standin_index(cells["pytorch-ngc:25.10"], "127.0.0.1:5000/nvidia/pytorch:25.10-py3",
                                   "127.0.0.1:5000", force=False, log=lambda line: None, log_dir=tmp_path,
                                   templates=REPO / "templates")
    assert [(r.platform, r.action) for r in results] == [("linux/amd64", "stand-in"), ("linux/arm64", "stand-in")]
    debian = "127.0.0.1:5000/library/debian:bookworm-slim"
    assert mirror.built == [("linux/amd64", f"{debian}@linux/amd64", True), ("linux/arm64", f"{debian}@linux/arm64",
                                                                            True)]
    assert mirror.index == list(BOTH)


def test_a_build_of_some_platforms_makes_only_their_stand_ins_and_keeps_the_others(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 55: `make build` (this machine's platform) of pytorch-ngc:25.10 makes its amd64 stand-in only, never the
    arm64 one (PyPI's CUDA torch, 4.9 GB); a platform the tag already holds is kept beside it, by digest."""
    cells = {c.key: c for c in _matrix_with(tmp_path, ARM64_TORCH).cells}
    cell = cells["pytorch-ngc:25.10"]
    for holds, index in (([], ["linux/amd64"]), (["linux/arm64"], list(BOTH)), (["linux/amd64"], None)):
        mirror = _FakeMirror(holds)
        mirror.install(monkeypatch)
        results = bases._standin_index(cell, "127.0.0.1:5000/nvidia/pytorch:25.10-py3", "127.0.0.1:5000", force=False,
                                       log=lambda line: None, log_dir=tmp_path, templates=REPO / "templates",
                                       only=("linux/amd64",))
        assert [r.platform for r in results] == ["linux/amd64"], holds
        assert [b[0] for b in mirror.built] == ([] if index is None else ["linux/amd64"]), holds
        assert mirror.index == index, holds


def test_an_image_on_the_arm64_child_of_a_stand_in_index_is_refused_by_digest_and_by_layers() -> None:
    """Release reads every child of the mirror's stand-in index: an arm64 image built on it is refused even with
    its stand-in labels stripped, by its base digest and by its first layers."""
    import json

    from buildtool.matrix.plan import Settings
    from buildtool.registry.client import OCI_INDEX
    from buildtool.release.gates import Platform, image_problems
    from buildtool.release.read import read_standins

    amd64, arm64 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"digest": amd64, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": arm64, "platform": {"os": "linux", "architecture": "arm64"}}]}
    layers = {amd64: ["sha256:" + "a" * 64], arm64: ["sha256:" + "b" * 64, "sha256:" + "c" * 64]}

    class Mirror:
        host = "127.0.0.1:5000"

        def get_manifest(self, repo: str, ref: str):  # noqa: ANN201
            if ref in layers:
                return json.dumps({"layers": [{"digest": d} for d in layers[ref]]}).encode(), OCI_MANIFEST, ref
            return json.dumps(index).encode(), OCI_INDEX, "sha256:" + "9" * 64

    found, problems = read_standins(Mirror(), Settings(base_mirror="127.0.0.1:5000"), [_ngc()])  # type: ignore[arg-type]
    assert problems == [] and {amd64, arm64} <= set(found.digests)
    cell = _ngc()
    labels = {label_keys.OCI_BASE_DIGEST: arm64, label_keys.CELL: cell.key}
    on_digest = Platform("linux/arm64", "sha256:" + "e" * 64, 1, labels, (*layers[arm64], "sha256:" + "f" * 64))
    assert any("is built on " + arm64 in p for p in image_problems(cell, [on_digest], found))
    other = {**labels, label_keys.OCI_BASE_DIGEST: "sha256:" + "8" * 64}
    on_layers = Platform("linux/arm64", "sha256:" + "e" * 64, 1, other, (*layers[arm64], "sha256:" + "f" * 64))
    assert any("starts with the layers of the stand-in" in p for p in image_problems(cell, [on_layers], found))


@pytest.mark.parametrize(("reported", "fails"), [("2.13.0+cu130", False), ("2.13.0+cpu", False),
                                                ("2.12.1+cu130", True)])
def test_the_framework_label_of_a_stand_in_is_what_its_framework_reports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reported: str, fails: bool) -> None:
    """PyPI's CUDA torch 2.13.0 reports 2.13.0+cu130: the label says so (the image tests compare the image with it);
    another public version than the requirement pins stops `bases`, naming both."""
    from buildtool.common import docker_cli
    from buildtool.common.errors import FailedError

    cells = {c.key: c for c in _matrix_with(tmp_path, ARM64_TORCH).cells}
    ran: list[tuple[str, ...]] = []

    def docker(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        ran.append(args)
        return subprocess.CompletedProcess(args, 0, f"{reported}\n", "")

    monkeypatch.setattr(docker_cli, "docker", docker)
    monkeypatch.setattr(bases.platforms, "host", lambda: platforms.get("linux/amd64"))
    cell = cells["pytorch-ngc:25.10"]
    if fails:
        with pytest.raises(FailedError, match=r"has torch 2.12.1\+cu130, not the 2.13.0 its requirement pins"):
            bases._measured_framework(cell, "img", "linux/arm64", tmp_path)
        return
    assert bases._measured_framework(cell, "img", "linux/arm64", tmp_path) == reported
    # Under QEMU with the emulated CPU sysfs: torch's oneDNN needs MIDR_EL1 to import at all.
    assert any(a.startswith("--volume=") and a.endswith(":/sys/devices/system/cpu:ro") for a in ran[0])
    assert ran[0][-3:] == ("python", "-c", "import torch; print(torch.__version__)")


def test_a_stand_in_whose_framework_import_runs_past_its_timeout_leaves_no_container(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The client killed at its timeout never runs its own `--rm`: the container, named, is removed after it (as
    image_probe's), and `bases` stops with one line naming the stand-in and the timeout."""
    from buildtool.common.errors import FailedError
    from tests.test_docker_cli import fake_client

    cell = {c.key: c for c in _matrix_with(tmp_path, ARM64_TORCH).cells}["pytorch-ngc:25.10"]
    # A `docker run` that hangs (exec: the client itself is what the timeout kills), as a QEMU import may.
    client, log = fake_client(tmp_path / "client", '[ "$1" = run ] && exec sleep 30')
    monkeypatch.setenv("DOCKER_CLIENT", str(client))
    monkeypatch.setattr(bases, "MEASURE_TIMEOUT", 1, raising=False)   # none before the fix: 900 s
    monkeypatch.setattr(bases.platforms, "host", lambda: platforms.get("linux/amd64"))
    with pytest.raises(FailedError, match=r"^stand-in of .* \(linux/arm64\): `import torch` did not finish within "
                                          r"1s$"):
        bases._measured_framework(cell, "img", "linux/arm64", tmp_path)
    calls = log.read_text().splitlines()
    run = next(c.split() for c in calls if c.startswith("run "))
    name = run[run.index("--name") + 1]
    assert f"rm -f -v {name}" in calls, calls


@pytest.mark.parametrize("failure", ["missing", "unreachable"])
def test_a_stand_in_child_the_mirror_cannot_serve_is_a_recorded_problem(failure: str) -> None:
    """The children of a stand-in index were read outside the guard the index's own read has: a child the mirror
    lacks (or a mirror gone mid-read) ended release and verify in a bare registry error instead of the problem
    that names the stand-in (which refuses the release the same way, saying why)."""
    import json

    from buildtool.matrix.plan import Settings
    from buildtool.registry.call_errors import NotFound, RegistryUnreachable
    from buildtool.registry.client import OCI_INDEX
    from buildtool.release.read import read_standins

    child = "sha256:" + "1" * 64
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"digest": child, "platform": {"os": "linux", "architecture": "amd64"}}]}

    class Mirror:
        host = "127.0.0.1:5000"

        def get_manifest(self, repo: str, ref: str):  # noqa: ANN201
            if ref == child:
                raise NotFound(f"{repo}@{ref}: not found") if failure == "missing" else RegistryUnreachable("gone")
            return json.dumps(index).encode(), OCI_INDEX, "sha256:" + "9" * 64

    found, problems = read_standins(Mirror(), Settings(base_mirror="127.0.0.1:5000"), [_ngc()])  # type: ignore[arg-type]
    cause = f"nvidia/pytorch@{child}: not found" if failure == "missing" else "gone"
    assert problems == [f"cannot read the stand-in 127.0.0.1:5000/nvidia/pytorch:25.10-py3 to check provenance "
                        f"({cause})"]
