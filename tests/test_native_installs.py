"""Native installs for foreign platforms (issue 38): a multi-platform pip cell's Python packages are checked
against their lock's hashes and unpacked by uv running on the build machine (a `FROM --platform=$BUILDPLATFORM`
stage, with TARGETARCH's wheel platform), then copied into the target platform's stage; only apt, the copy and
a smoke import run on the target (under QEMU on another machine). Tests on the rendered Dockerfile (its stages,
the shell of its RUN lines run by bash) and on what `buildtool build` hands the build."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from buildtool.common.errors import FailedError
from buildtool.contracts import locks, platforms
from buildtool.imagebuild import builder as builder_mod
from buildtool.imagebuild import engine
from buildtool.imagebuild.builder import BaseInfo
from buildtool.render.dockerfiles import TemplateError, render_cell_dockerfile
from tests.conftest import REPO, fixture_matrix
from tests.test_multiplatform_build import run  # noqa: F401 - the fixture, shared
from tests.test_platform_locks import _multi, _per_arch_project, _single


def _render(tmp_path: Path, cell: Any = None) -> str:
    root = _per_arch_project(tmp_path)
    return render_cell_dockerfile(fixture_matrix(), cell or _multi(), REPO / "templates", root=root)


def _stages(text: str) -> dict[str, str]:
    """Stage name (the last, unnamed one: 'final') -> its FROM line and instructions."""
    parts = re.split(r"(?m)^(?=FROM )", text)
    stages = {}
    for part in parts[1:]:
        first = part.splitlines()[0]
        name = first.split(" AS ")[1].strip() if " AS " in first else "final"
        stages[name] = part
    return stages


def _runs(stage: str) -> list[str]:
    """The RUN instructions of a stage, continued lines joined as the Dockerfile parser joins them."""
    return [m.replace("\\\n", "") for m in re.findall(r"(?ms)^RUN .*?(?<!\\)\n", stage)]


def test_the_installs_run_in_build_platform_stages_and_the_image_only_copies_them(tmp_path: Path) -> None:
    text = _render(tmp_path)
    assert text.index("ARG BUILD_BASE_IMAGE=") < text.index("\nFROM ")  # a global ARG, usable in any FROM
    stages = _stages(text)
    assert list(stages) == ["debs", "base", "build-base", "uv", "site-framework", "site-tools", "cpu-identity",
                            "final"]
    assert stages["build-base"].startswith("FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS build-base\n")
    for name in ("uv", "site-framework", "site-tools", "cpu-identity"):
        assert stages[name].startswith(f"FROM build-base AS {name}\n"), name
    for name, lock in (("site-framework", locks.FRAMEWORK_LOCK), ("site-tools", locks.TOOLS_LOCK)):
        [install] = [r for r in _runs(stages[name]) if "uv pip install" in r]
        assert "--preview-features pylock" in install and "--require-hashes" in install
        assert '--python-platform "${wheel_platform}" --python-version 3.11' in install
        assert f'sed -f /run/secrets/lock-urls "/run/lock/${{TARGETARCH}}/{lock}"' in install
        assert f"-r /run/{lock} " in install
        assert "py_compile" in install  # bytecode written on the build machine, same Python minor version
    final = stages["final"]
    assert final.startswith("FROM base\n")
    assert "uv pip install" not in final and "/run/uv/uv" not in final and "ARG TARGETARCH" not in final
    framework = final.index("COPY --from=site-framework /opt/venv/ /opt/venv/")
    tools = final.index("COPY --from=site-tools /opt/venv/ /opt/venv/")
    smoke = final.index("python -c 'import torch'")
    assert framework < tools < smoke
    # The target stage's own RUN lines (besides apt, in base): the venv, the smoke import, /workspace.
    final_runs = _runs(final)
    assert len(final_runs) == 3, final_runs
    assert "python3 -m venv --without-pip" in final_runs[0]
    assert final_runs[1] == ("RUN --mount=type=tmpfs,target=/tmp     --mount=type=bind,from=cpu-identity,source=/cpu,"
                             "target=/sys/devices/system/cpu     python -c 'import torch'\n")
    assert final_runs[2].startswith("RUN mkdir -p /workspace")


def test_the_smoke_import_sees_an_arm64_cpu_identity_not_the_build_machines(tmp_path: Path) -> None:
    """Under QEMU an x86 host's CPU sysfs shows through and torch's oneDNN segfaults at import (no MIDR_EL1):
    the cpu-identity stage's script, run by bash into a folder, makes the files xbyak_aarch64 reads."""
    stage = _stages(_render(tmp_path))["cpu-identity"]
    [script] = [r[len("RUN "):] for r in _runs(stage)]
    root = tmp_path / "root"
    done = subprocess.run(["bash", "-c", script.replace('"/cpu', f'"{root}/cpu')], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    for cpu in ("cpu0", "cpu1"):
        assert (root / "cpu" / cpu / "regs/identification/midr_el1").read_text() == "0x00000000410fd4f0\n"
    assert (root / "cpu" / "online").read_text() == "0-1\n"


def test_the_build_machines_apt_step_is_the_base_stages_byte_for_byte(tmp_path: Path) -> None:
    """So BuildKit runs it once when the build machine is the target platform (the amd64 build)."""
    stages = _stages(_render(tmp_path))
    [base_apt] = [r for r in _runs(stages["base"]) if "apt-get install" in r]
    [native_apt] = [r for r in _runs(stages["build-base"]) if "apt-get install" in r]
    assert base_apt == native_apt
    assert 'arch="$(dpkg --print-architecture)"' in base_apt and "TARGETARCH" not in base_apt
    head = stages["base"].split("RUN ", 1)[0].splitlines()[1:]
    assert head == stages["build-base"].split("RUN ", 1)[0].splitlines()[1:]  # SHELL, ARGs: same env


def test_the_apt_step_installs_the_debs_stages_files_and_fetches_nothing(tmp_path: Path) -> None:
    """apt's index download and parsing run on the build machine (the debs stage); the target's apt step (under
    QEMU for arm64) only installs the .debs that stage fetched and checked."""
    stages = _stages(_render(tmp_path))
    assert stages["debs"].startswith("FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS debs\n")
    [fetch] = _runs(stages["debs"])
    assert "apt-get update" in fetch and "apt-get download" in fetch and "apt-get install" not in fetch
    for name in ("base", "build-base"):
        [install] = [r for r in _runs(stages[name]) if "apt-get install" in r]
        assert "--mount=type=bind,from=debs,source=/debs,target=/run/debs" in install
        assert 'apt-get install -y --no-install-recommends "/run/debs/${arch}/"*.deb' in install
        assert "apt-get update" not in install and "apt.pins" in install


def _fake_deb(folder: Path, name: str, version: str, arch: str, payload: str = "") -> Path:
    """A real .deb (dpkg-deb --build) named as `apt-get download` names it."""
    tree = folder / f"tree-{name}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
                                              f"Maintainer: t <t@example.org>\nDescription: test {payload}\n")
    deb = folder / f"{name}_{version.replace(':', '%3a')}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)], check=True,
                   capture_output=True, timeout=60)
    return deb


def _debs_project(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The per-arch fixture project whose arm64/debs.sha256 records the sha256 of real .debs of its pins
    (made in `archive`, where the stand-in apt-get downloads from)."""
    import hashlib

    from buildtool.contracts.apt_lock_format import APT_LOCK, DEB_HASHES, parse_apt_lock

    root = _per_arch_project(tmp_path)
    folder = (root / _single().dockerfile).parent
    pins = parse_apt_lock((folder / "arm64" / APT_LOCK).read_text()).pins()
    archive = tmp_path / "archive"
    archive.mkdir()
    lines = []
    for pin in pins:
        name, version = pin.split("=", 1)
        deb = _fake_deb(archive, name, version, "arm64")
        lines.append(f"{pin} {hashlib.sha256(deb.read_bytes()).hexdigest()}\n")
    (folder / "arm64" / DEB_HASHES).write_text("".join(lines))
    return root, archive, pins


def _run_fetch(tmp_path: Path, root: Path, archive: Path, arch: str = "arm64") -> subprocess.CompletedProcess[str]:
    """The debs stage's RUN line run by bash as BuildKit would, for one architecture, with a stand-in apt-get
    (update: nothing; download NAME=VERSION...: copies those .debs from `archive` into the working directory)
    and chown; the real dpkg-deb, sha256sum and diff. /run and /debs moved under tmp_path."""
    text = render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)
    [fetch] = _runs(_stages(text)["debs"])
    script = fetch[len("RUN --mount=type=tmpfs,target=/run "):]
    script = script.replace('"/run/', f'"{tmp_path}/run/').replace('"/debs/', f'"{tmp_path}/debs/')
    (tmp_path / "run").mkdir(exist_ok=True)   # BuildKit's tmpfs
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apt-get").write_text(
        "#!/bin/bash\n[ \"$1\" = update ] && exit 0\nshift\n"
        f"for pin in \"$@\"; do cp {archive}/\"${{pin%%=*}}\"_*.deb . || exit 100; done\n")
    (bin_dir / "chown").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("apt-get", "chown"):
        (bin_dir / tool).chmod(0o755)
    return subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "BUILDARCH": arch, "TARGETARCH": arch})


def test_the_debs_stage_keeps_debs_whose_sha256_is_the_locks_and_lists_the_pins(tmp_path: Path) -> None:
    root, archive, pins = _debs_project(tmp_path)
    done = _run_fetch(tmp_path, root, archive)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "debs/arm64/apt.pins").read_text().splitlines() == pins
    assert len(list((tmp_path / "debs/arm64").glob("*.deb"))) == len(pins)


def test_a_deb_whose_sha256_is_not_the_locks_stops_the_build_naming_it(tmp_path: Path) -> None:
    """A mirror (or a man in the middle) serving other bytes under a pinned name and version."""
    root, archive, pins = _debs_project(tmp_path)
    name, version = pins[3].split("=", 1)
    _fake_deb(archive / "other", name, version, "arm64", payload="tampered")
    for deb in archive.glob(f"{name}_*.deb"):
        deb.unlink()
    for deb in (archive / "other").glob("*.deb"):
        deb.rename(archive / deb.name)
    done = _run_fetch(tmp_path, root, archive)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("ERROR: the .debs fetched for arm64 are not those arm64/debs.sha256 records (recorded <, "
                           f"fetched >: < {pins[3]} ")
    assert f"> {pins[3]} " in line and line.endswith("; run make lock FRAMEWORK=pytorch-cpu:2.13")
    assert not (tmp_path / "debs/arm64/apt.pins").exists()


def test_a_pin_without_a_recorded_sha256_stops_the_build_naming_it(tmp_path: Path) -> None:
    """debs.sha256's `-` (the archive no longer served that version when `make lock` ran), or no line at all."""
    from buildtool.contracts.apt_lock_format import DEB_HASHES

    root, archive, pins = _debs_project(tmp_path)
    hashes = (root / _single().dockerfile).parent / "arm64" / DEB_HASHES
    lines = hashes.read_text().splitlines()
    lines[0] = lines[0].split(" ")[0] + " -"
    hashes.write_text("".join(line + "\n" for line in lines[:-1]))   # the last pin has no line at all
    done = _run_fetch(tmp_path, root, archive)
    assert done.returncode == 1
    assert done.stderr == (f"ERROR: arm64/debs.sha256 records no sha256 for {pins[0]} {pins[-1]}; "
                           "run make lock FRAMEWORK=pytorch-cpu:2.13\n")


def test_a_debs_sha256_that_does_not_parse_is_refused_at_render_naming_it(tmp_path: Path) -> None:
    from buildtool.contracts.apt_lock_format import DEB_HASHES

    root = _per_arch_project(tmp_path)
    (root / _single().dockerfile).parent.joinpath("arm64", DEB_HASHES).write_text("ca-certificates=1 nothex\n")
    with pytest.raises(TemplateError, match=r"arm64/debs.sha256 line 1: 'ca-certificates=1 nothex' is not "
                                            r"`name=version <sha256 or ->`; run `make lock FRAMEWORK=pytorch-cpu"):
        render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)


def _wheel_platform_case(text: str) -> str:
    stage = _stages(text)["site-framework"]
    found = re.search(r'(?s)(case "\$\{TARGETARCH\}" in \\\n.*?esac)', stage)
    assert found, stage
    return found.group(1).replace("\\\n", "") + '; echo "$wheel_platform"'


@pytest.mark.parametrize("platform", ["linux/amd64", "linux/arm64"])
def test_each_targetarch_installs_for_its_machine_and_its_bases_glibc(tmp_path: Path, platform: str) -> None:
    """The lock is resolved under the platform's lower cap (manylinux_2_28: the versions); the install picks
    among each version's files as pip in the image would, for the base's glibc (libc6 2.36 in base.dpkg). Under
    the 2_28 cap uv took xprof 2.21.6's cp311-none-any wheel (a Windows .pyd inside) over its
    manylinux_2_35_aarch64 one, and arm64 jax-cpu had no profile plugin (CI run of 4795d01)."""
    script = _wheel_platform_case(_render(tmp_path))
    known = platforms.get(platform)
    done = subprocess.run(["bash", "-c", script], env={"TARGETARCH": known.architecture, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{known.machine}-manylinux_2_36"
    lock_text = (_per_arch_project(tmp_path / "again") / Path(_single().dockerfile).parent / known.architecture
                 / locks.FRAMEWORK_LOCK).read_text()
    assert f'platform = "{known.wheel_platform}"\ntarget = "{platform}"\n' in lock_text


def test_a_base_dpkg_without_libc6_is_refused_naming_it(tmp_path: Path) -> None:
    root = _per_arch_project(tmp_path)
    dpkg = (root / Path(_single().dockerfile).parent / "arm64" / "base.dpkg")
    dpkg.write_text("".join(line + "\n" for line in dpkg.read_text().splitlines() if not line.startswith("libc6=")))
    with pytest.raises(TemplateError, match=r"arm64/base.dpkg names no libc6 version \(''\), so the wheels' glibc "
                                            r"is unknown; run `make lock FRAMEWORK=pytorch-cpu:2.13`"):
        render_cell_dockerfile(fixture_matrix(), _multi(), REPO / "templates", root=root)


def test_an_unknown_targetarch_stops_the_native_install_naming_it(tmp_path: Path) -> None:
    script = _wheel_platform_case(_render(tmp_path))
    done = subprocess.run(["bash", "-c", script], env={"TARGETARCH": "riscv64", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert done.stderr == ("ERROR: no wheel platform for TARGETARCH=riscv64: this cell is built for linux/amd64 "
                           "linux/arm64 (matrix.yaml platforms)\n")


def test_a_single_platform_cell_has_no_native_stages(tmp_path: Path) -> None:
    single = render_cell_dockerfile(fixture_matrix(), _single(), REPO / "templates",
                                    root=REPO / "tests/fixtures/project")
    assert "BUILDPLATFORM" not in single and "BUILD_BASE_IMAGE" not in single
    assert not _single().native_installs
    # Every multi-platform cell installs natively; an NGC one's stages: tests/test_ngc_native.py.
    assert replace(_multi(), framework_requirements=()).native_installs
    assert _multi().native_installs


def test_the_committed_jax_cpu_dockerfile_installs_natively() -> None:
    text = (REPO / "dockerfiles/jax/jax-cpu/0.10/Dockerfile").read_text()
    stages = _stages(text)
    assert "build-base" in stages and "uv pip install" not in stages["final"]
    assert "python -c 'import jax'" in stages["final"]


# -- what `buildtool build` hands BuildKit -----------------------------------------------------------------

def _capture(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    fake = engine.build

    def build(client: Any, request: engine.BuildRequest) -> str:
        seen[str(request.platform)] = dict(request.build_args)
        return fake(client, request)

    monkeypatch.setattr(engine, "build", build)
    return seen


def test_every_platforms_build_gets_this_machines_image_of_the_base_for_the_native_stages(
        run, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _, start = run
    build, plan, _ = start()
    monkeypatch.setattr(builder_mod.platforms, "host", lambda: platforms.get("linux/amd64"))
    seen = _capture(monkeypatch)
    amd64_base = BaseInfo(ref="127.0.0.1:5000/library/debian:bookworm-slim", digest="sha256:" + "a" * 64)
    result = build.run_cell(plan, amd64_base)
    assert result.result != "failed", result.message
    amd64 = "127.0.0.1:5000/library/debian@sha256:" + "a" * 64
    arm64 = "127.0.0.1:5000/library/debian@sha256:" + "b" * 64
    assert seen["linux/amd64"]["BASE_IMAGE"] == amd64 and seen["linux/amd64"]["BUILD_BASE_IMAGE"] == amd64
    assert seen["linux/arm64"]["BASE_IMAGE"] == arm64 and seen["linux/arm64"]["BUILD_BASE_IMAGE"] == amd64


def test_a_base_without_this_machines_platform_fails_the_foreign_build_naming_it(
        run, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _, start = run
    build, plan, _ = start()
    # This machine is amd64 and the mirror's base has only an arm64 image: the arm64 build has no base for
    # its native stages, and is refused naming the platform it lacks (never the target's base instead).
    monkeypatch.setattr(builder_mod.platforms, "host", lambda: platforms.get("linux/amd64"))
    arm64 = BaseInfo(ref="127.0.0.1:5000/library/debian:bookworm-slim", digest="sha256:" + "b" * 64)
    monkeypatch.setattr(builder_mod, "resolve_base", lambda plan, platform=None: arm64 if platform == "linux/arm64"
                        else None)
    with pytest.raises(FailedError, match=r"base docker.io/library/debian:bookworm-slim has no linux/amd64 image"):
        build._buildkit(plan, arm64, "key", REPO / "build-logs" / "none.log", "linux/arm64")


def test_each_platforms_content_key_covers_this_machines_image_of_the_base(
        run, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The native stages' output is copied into every platform's image, and it depends on the build machine's image
    of the base (an NGC cell's tools are installed by that image's own Python): a changed build base, or a machine
    of the other platform, is another content key and a build, never a reuse of an image of other inputs; the
    image's label names the build base its key covers (release's retag check reads it back)."""
    from buildtool.contracts import label_keys
    from buildtool.imagebuild.cell_inputs import cell_content_key

    _, start = run
    keys: dict[tuple[str, str], dict[str, str]] = {}
    built: dict[tuple[str, str], list[str]] = {}
    for host, digests in (("linux/amd64", "ab"), ("linux/amd64", "cb"), ("linux/arm64", "ab")):
        monkeypatch.setattr(builder_mod.platforms, "host", lambda host=host: platforms.get(host))
        build, plan, fakes = start(base_digests=digests)
        result = build.run_cell(plan, BaseInfo("unused", "sha256:" + "0" * 64))
        assert result.result == "pushed", result.message
        keys[host, digests] = {p["platform"]: p["content_key"] for p in result.platforms}
        built[host, digests] = fakes.builds
    first = keys["linux/amd64", "ab"]
    # Only the amd64 machine's base changed (arm64's target base is the same): the arm64 image is built again.
    assert keys["linux/amd64", "cb"]["linux/arm64"] != first["linux/arm64"]
    assert built["linux/amd64", "cb"] == ["linux/amd64", "linux/arm64"]
    # The same bases, built on an arm64 machine (its native stages on arm64's image): other keys, both platforms.
    assert keys["linux/arm64", "ab"]["linux/amd64"] != first["linux/amd64"]
    assert keys["linux/arm64", "ab"]["linux/arm64"] != first["linux/arm64"]
    assert built["linux/arm64", "ab"] == ["linux/amd64", "linux/arm64"]
    # The label names the build machine's base, and with it the key is computed again as release computes it.
    arm64 = fakes.labels["image-linux/arm64"]
    assert arm64[label_keys.BUILD_BASE_DIGEST] == "sha256:" + "b" * 64
    base = BaseInfo(plan.base, arm64[label_keys.OCI_BASE_DIGEST],
                    build=BaseInfo(plan.base, arm64[label_keys.BUILD_BASE_DIGEST]))
    assert cell_content_key(plan, REPO, base, "linux/arm64") == arm64[label_keys.CONTENT_KEY]
