"""The apt lock: its format (fail closed), the pinned install it renders, the offline and re-resolution drift
checks, and the one-line message of a build whose locked version Debian no longer serves."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import docker.errors
import pytest
import requests

from buildtool.common.files import write_changed
from buildtool.contracts.apt_lock_format import entries_digest, parse_apt_lock, parse_deb_hashes, parse_simulation
from buildtool.imagebuild import aptlock
from buildtool.imagebuild.engine import last_error_line
from buildtool.matrix.loader import load_matrix
from buildtool.render.dockerfiles import TemplateError, render_cell_dockerfile
from tests.conftest import FIXTURE_PROJECT, REPO, fixture_matrix

CELL = "pytorch-cpu:2.13"
REL = "dockerfiles/pytorch/pytorch-cpu/2.13/apt.lock"
LOCK_TEXT = (FIXTURE_PROJECT / REL).read_text()


def _cell(key: str = CELL):
    return next(c for c in fixture_matrix().cells if c.key == key)


# -- format -------------------------------------------------------------------------------------------

def test_the_committed_lock_parses_with_every_package_it_installs():
    lock = parse_apt_lock(LOCK_TEXT)
    assert lock.entries["openssl"] == "3.0.20-1~deb12u2" and lock.entries["python3-venv"] == "3.11.2-1+b1"
    assert lock.header["base"] == "docker.io/library/debian:bookworm-slim" and lock.digest_matches()
    assert "(debootstrap --variant=minbase bookworm)" in lock.header["resolved-in"]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t + "openssl\n", "line 41: 'openssl' is not `name=version`"),
    (lambda t: t + "Openssl=1.0\n", "is not `name=version`"),
    (lambda t: t + "openssl=1.0 && touch /x\n", "is not `name=version`"),
    (lambda t: t + "openssl=3.0.20-1~deb12u2\n", "openssl is listed twice"),
    (lambda t: t.replace("# arch: amd64\n", ""), "header lacks `# arch:`"),
    (lambda t: t.replace("# format: 1", "# format: 2"), "format '2' is not 1"),
    (lambda t: t.replace("# entries: sha256:", "# entries: md5:"), "header `entries` 'md5:"),
    (lambda t: "\n".join(ln for ln in t.splitlines() if ln.startswith("#")) + "\n", "no `name=version` entries"),
])
def test_a_malformed_lock_is_refused_naming_what(edit, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_apt_lock(edit(LOCK_TEXT))


def test_simulation_lines_upgrades_included_and_an_unreadable_one_refused():
    out = ("NOTE: This is only a simulation!\n"
           "Inst libssl3 [3.0.15-1~deb12u1] (3.0.17-1~deb12u2 Debian:12.12/stable [amd64])\n"
           "Inst procps (2:4.0.2-3 Debian:12.12/stable [amd64])\nConf procps (2:4.0.2-3 Debian [amd64])\n")
    assert parse_simulation(out) == {"libssl3": "3.0.17-1~deb12u2", "procps": "2:4.0.2-3"}
    with pytest.raises(ValueError, match=re.escape("cannot read apt's simulated install line 'Inst ???'")):
        parse_simulation("Inst ???\n")



def test_a_simulated_package_of_a_foreign_architecture_or_named_twice_is_refused():
    """`Inst libc6:i386 ...` (a base with a foreign architecture added) was kept as `libc6`: it overwrote the
    native libc6's version, or alone was locked as a native package the lock's `libc6=...` then installs."""
    native = "Inst libc6 (2.36-9+deb12u10 Debian:12.12/stable [amd64])\n"
    foreign = "Inst libc6:i386 (2.36-9+deb12u9 Debian:12.12/stable [i386])\n"
    assert parse_simulation(native, "amd64") == {"libc6": "2.36-9+deb12u10"}
    for output in (native + foreign, foreign):
        with pytest.raises(ValueError, match=re.escape("adds libc6:i386, a package of another architecture than "
                                                       "amd64's")):
            parse_simulation(output, "amd64")
    with pytest.raises(ValueError, match=re.escape("names libc6 twice (2.36-9+deb12u10 and 2.36-9+deb12u9)")):
        parse_simulation(native + foreign.replace(":i386", ":amd64"), "amd64")
    out = ("--- arch\namd64\n--- base\nbash=5.2\n--- plan\n" + native + foreign + "--- pinned\n" + native
           + "--- served\n--- hashes\n")
    with pytest.raises(ValueError, match=re.escape("libc6:i386")):
        aptlock.parse_probe(out)


# -- render --------------------------------------------------------------------------------------------

def test_render_pins_every_locked_package_and_stops_without_a_lock(tmp_path: Path):
    matrix = fixture_matrix()
    pinned = render_cell_dockerfile(matrix, _cell(), REPO / "templates", root=FIXTURE_PROJECT)
    for name, version in parse_apt_lock(LOCK_TEXT).entries.items():
        assert f"{name}={version}" in pinned
    assert "xargs apt-get install -y --no-install-recommends < /run/apt.pins" in pinned
    missing = render_cell_dockerfile(matrix, _cell(), REPO / "templates", root=tmp_path)
    assert "apt-get install" not in missing
    assert 'RUN echo "ERROR: apt.lock is missing beside this Dockerfile; run make lock FRAMEWORK=pytorch-cpu:2.13"' \
        in missing
    broken = tmp_path / REL
    broken.parent.mkdir(parents=True)
    broken.write_text(LOCK_TEXT + "not a pin\n")
    with pytest.raises(TemplateError, match=f"{REL}: line 41: 'not a pin' is not `name=version`; run `make lock"):
        render_cell_dockerfile(matrix, _cell(), REPO / "templates", root=tmp_path)


@pytest.mark.parametrize("edit", [
    lambda t: t + "zlib1g=1:1.2.13.dfsg-1\n",                                            # added, well formed
    lambda t: t.replace("openssl=3.0.20-1~deb12u2", "openssl=3.0.11-1~deb12u2"),        # re-versioned
])
def test_render_refuses_a_lock_whose_entries_do_not_match_its_recorded_digest(tmp_path: Path, edit):
    """Issue 37: a hand-added, well-formed entry was written into the Dockerfile with exit 0 (only `check` noticed)."""
    edited = tmp_path / REL
    edited.parent.mkdir(parents=True)
    edited.write_text(edit(LOCK_TEXT))
    with pytest.raises(TemplateError) as refused:
        render_cell_dockerfile(fixture_matrix(), _cell(), REPO / "templates", root=tmp_path)
    assert str(refused.value).startswith(f"{REL}: its entries no longer match its recorded digest (sha256:")
    assert str(refused.value).endswith(f"it was edited by hand; run `make lock FRAMEWORK={CELL}`")


# -- offline check ---------------------------------------------------------------------------------------

def test_the_fixture_locks_pass_the_offline_check():
    assert aptlock.check_cell(FIXTURE_PROJECT, _cell()) == []


def test_a_package_added_to_the_matrix_but_not_locked_is_named(project: Path):
    matrix = project / "matrix.yaml"
    text = matrix.read_text()
    block = text.index("  - name: pytorch-cpu")
    matrix.write_text(text[:block] + text[block:].replace("    versions:", "    apt_packages: [procps]\n    versions:",
                                                          1))
    cell = next(c for c in load_matrix(matrix).cells if c.key == CELL)
    problems = aptlock.check_cell(project, cell)
    assert f"{REL} is stale (the matrix's apt packages or base changed); run `make lock FRAMEWORK={CELL}`" in problems
    assert f"{REL}: procps is named in matrix.yaml but not locked; run `make lock FRAMEWORK={CELL}`" in problems


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("media-types=10.0.0\n", ""),                                   # deleted
    lambda t: t + "zlib1g=1:1.2.13.dfsg-1\n",                                            # added
    lambda t: t.replace("openssl=3.0.20-1~deb12u2", "openssl=3.0.11-1~deb12u2"),        # re-versioned
])
def test_a_hand_edited_lock_fails_the_offline_check(project: Path, edit):
    path = project / REL
    path.write_text(edit(path.read_text()))
    problems = aptlock.check_cell(project, _cell())
    assert problems[0] == (f"{REL}: its entries are not the ones `make lock` wrote (edited by hand: a line deleted, "
                           f"added or re-versioned); run `make lock FRAMEWORK={CELL}`")
    # debs.sha256 then names the package the edit moved, where it moved one the base does not hold already
    assert all("debs.sha256 does not list exactly" in p for p in problems[1:]), problems


def test_a_base_list_that_is_not_the_locks_is_named(project: Path):
    path = project / "dockerfiles/pytorch/pytorch-cpu/2.13/base.dpkg"
    path.write_text(path.read_text().replace("bash=", "bash=9"))
    problems = aptlock.check_cell(project, _cell())
    assert problems[0] == ("dockerfiles/pytorch/pytorch-cpu/2.13/base.dpkg is not the base list "
                           f"{REL} was resolved with; run `make lock FRAMEWORK={CELL}`")
    assert "debs.sha256 does not list exactly" in problems[1] and "bash=95.2" in problems[1]   # nor its hashes


def test_ngc_cells_have_no_apt_step_and_refuse_apt_packages_and_a_stray_lock(project: Path):
    cell = dataclasses.replace(_cell("pytorch-ngc:25.10"), apt_packages=("procps",))
    stray = project / "dockerfiles/pytorch/pytorch-ngc/25.10/apt.lock"
    stray.write_text(LOCK_TEXT)
    assert aptlock.check_cell(project, cell) == [
        "pytorch-ngc:25.10: apt_packages procps on an NGC cell, whose template runs no apt step (they would never "
        "be installed); remove them from matrix.yaml",
        "dockerfiles/pytorch/pytorch-ngc/25.10/apt.lock: an NGC cell installs no Debian packages; delete it"]


def test_make_check_offline_names_the_hand_edit_and_make_lock(project: Path, run_cli):
    path = project / REL
    path.write_text(path.read_text().replace("media-types=10.0.0\n", ""))
    code, _, err = run_cli("check", "--offline", "--matrix", str(project / "matrix.yaml"))
    assert code == 1
    assert f"lock: {REL}: its entries are not the ones `make lock` wrote" in err
    assert "lock problem(s); run `make lock`" in err      # not `make render`: the Dockerfile drifted with it


# -- re-resolution drift -----------------------------------------------------------------------------------

def _probe(plan: dict[str, str], base: dict[str, str], served: set[tuple[str, str]] | None = None,
           pinned: dict[str, str] | None = None):
    return aptlock.Probe(arch="amd64", base=base, plan=plan, served=served if served is not None else set(plan.items()),
                         pinned=pinned if pinned is not None else plan)


def test_drift_names_each_hand_edit_by_kind():
    """What apt answers for such a lock: the pinned closure keeps a served locked version (libnsl2) and falls
    back to the candidate where the locked one is gone (openssl); the plain resolution is `make lock`'s."""
    lock = parse_apt_lock(LOCK_TEXT)
    base = {"bash": "5.2.15-2+b13"}
    resolution = dict(lock.entries)
    edited = dict(lock.entries)
    del edited["media-types"]                          # deleted by hand
    edited["zlib1g"] = "1:1.2.13.dfsg-1"               # added by hand
    edited["libnsl2"] = "1.3.0-1"                      # re-versioned by hand (to a version still served)
    edited["openssl"] = "3.0.11-1~deb12u2"             # a version Debian no longer serves
    served = set(resolution.items()) | {("libnsl2", "1.3.0-1")}
    pinned = {**resolution, "libnsl2": "1.3.0-1"}
    hand = dataclasses.replace(lock, entries=edited)
    assert aptlock.compare(REL, hand, _probe(resolution, base, served, pinned), "base.dpkg", base) == [
        f"{REL}: libnsl2 re-versioned by hand (lock 1.3.0-1, `make lock` resolves 1.3.0-2)",
        f"{REL}: media-types deleted by hand (the resolution installs media-types 10.0.0)",
        f"{REL}: openssl 3.0.11-1~deb12u2 is no longer served by Debian (it serves 3.0.20-1~deb12u2)",
        f"{REL}: zlib1g added by hand (1:1.2.13.dfsg-1 is listed but nothing installs it)",
    ]
    assert aptlock.compare(REL, lock, _probe(resolution, base), "base.dpkg", base) == []


def test_drift_names_a_base_other_than_the_recorded_one():
    lock = parse_apt_lock(LOCK_TEXT)
    found = aptlock.compare(REL, lock, _probe(dict(lock.entries), {"bash": "5.2.15-2+b14"}), "base.dpkg",
                            {"bash": "5.2.15-2+b13"})
    assert found == ["base.dpkg: the base is not the one the lock was resolved in (1 package(s) differ: bash "
                     "5.2.15-2+b13 -> 5.2.15-2+b14)"]


def test_preferences_pin_every_locked_version():
    text = aptlock.preferences({"openssl": "3.0.20-1~deb12u2"})
    assert text == "Package: openssl\nPin: version 3.0.20-1~deb12u2\nPin-Priority: 1001\n\n"


def test_probe_output_is_read_fail_closed():
    out = ("--- arch\namd64\n--- base\nbash=5.2\n--- plan\nInst procps (2:4.0.2-3 D [amd64])\n"
           "--- pinned\nInst procps (2:4.0.2-2 D [amd64])\n--- served\n"
           " procps | 2:4.0.2-3 | http://deb.debian.org/debian bookworm/main amd64 Packages\n"
           "--- hashes\nPackage: procps\nVersion: 2:4.0.2-3\nSHA256: " + "c" * 64 + "\nDescription: ps\n top\n\n"
           "Package: bash\nVersion: 5.2\nDescription: no hash listed\n")
    probe = aptlock.parse_probe(out)
    assert probe.plan == {"procps": "2:4.0.2-3"} and probe.served == {("procps", "2:4.0.2-3")}
    assert probe.pinned == {"procps": "2:4.0.2-2"}
    assert probe.hashes == {"procps=2:4.0.2-3": "c" * 64}       # bash's record has no SHA256: not served
    with pytest.raises(ValueError, match="the probe printed no served, hashes section"):
        aptlock.parse_probe(out[:out.index("--- served")])
    with pytest.raises(ValueError, match="apt-get install -s refused: Version '9' for 'procps' was not found"):
        aptlock.parse_probe(out.replace("Inst procps (2:4.0.2-3 D [amd64])",
                                        "E: Version '9' for 'procps' was not found"))



class _ProbeContainer:
    """A container whose `failing` step raises `error`; records its removal."""

    short_id = "0123456789ab"

    def __init__(self, failing: str, error: Exception) -> None:
        self.failing, self.error, self.removed = failing, error, False

    def start(self) -> None:
        if self.failing == "start":
            raise self.error

    def wait(self, timeout: int) -> dict[str, int]:
        if self.failing == "wait":
            raise self.error
        return {"StatusCode": 0}

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return b""

    def remove(self, force: bool) -> None:
        self.removed = force


@pytest.mark.parametrize("failing, error, message", [
    # docker-py's wait past its timeout (a QEMU apt-get update slower than PROBE_TIMEOUT)
    ("wait", requests.exceptions.ConnectionError("Read timed out"),
     r"the apt probe in debian:bookworm-slim did not finish within 300s .*: Read timed out$"),
    ("wait", requests.exceptions.ReadTimeout("read timeout=300"),
     r"the apt probe in debian:bookworm-slim did not finish within 300s .*: read timeout=300$"),
    ("start", docker.errors.APIError("500 Server Error", explanation="cannot start: no space left"),
     r"the apt probe in debian:bookworm-slim failed in the engine: cannot start: no space left$"),
    ("create", docker.errors.ImageNotFound("No such image: debian:bookworm-slim"),
     r"cannot ask the base debian:bookworm-slim for its apt packages: No such image: debian:bookworm-slim; "),
])
def test_an_engine_failure_in_the_apt_probe_is_one_line_and_removes_its_container(monkeypatch, failing, error,
                                                                                   message):
    """`make lock` with a probe that runs past its timeout, or an engine that refuses: one FailedError naming the
    probe and the cause, never the SDK's traceback, and the container (still running after a timeout) removed."""
    from buildtool.common.errors import FailedError
    from buildtool.imagebuild import engine

    container = _ProbeContainer(failing, error)

    def create(*args, **kwargs):
        if failing == "create":
            raise container.error
        return container

    monkeypatch.setattr(engine, "image_attrs", lambda ref: {})
    monkeypatch.setattr(engine, "sdk", lambda: SimpleNamespace(containers=SimpleNamespace(create=create)))
    with pytest.raises(FailedError, match=message):
        aptlock.run_probe("debian:bookworm-slim", ["curl"])
    assert container.removed or failing == "create"


@pytest.mark.parametrize("error", [requests.exceptions.ConnectionError("Read timed out"),
                                   requests.exceptions.ReadTimeout("read timeout=120")])
def test_a_short_command_past_its_timeout_says_so_whichever_way_the_sdk_says_it(monkeypatch, error):
    """run_output (the image diff's and the SBOM's short commands) took only ReadTimeout for a timeout: the SDK's
    other way of saying it, a ConnectionError "Read timed out", was "failed in the engine". One rule, the apt
    probe's, now serves both."""
    from buildtool.imagebuild import engine

    container = _ProbeContainer("wait", error)
    monkeypatch.setattr(engine, "sdk", lambda: SimpleNamespace(containers=SimpleNamespace(
        create=lambda *a, **k: container)))
    with pytest.raises(RuntimeError, match=r"^dpkg-query in debian:bookworm-slim did not finish within 120s$"):
        engine.run_output("debian:bookworm-slim", ["dpkg-query", "-W"])
    assert container.removed


# -- the build's one line -------------------------------------------------------------------------------

def test_resolved_in_names_the_digest_of_the_bases_own_repository(monkeypatch):
    """`resolved-in` is the digest the base's repository has (a registry's `:port` is no tag; Docker Hub's listed
    by its short name); with none of its own (another registry's only, or none: built here), one line refuses."""
    from buildtool.common.errors import FailedError
    from buildtool.imagebuild import engine

    ours, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    digests = [f"mirror.example/library/debian@{other}", f"127.0.0.1:5000/library/debian@{ours}"]
    monkeypatch.setattr(engine, "image_attrs", lambda ref: {"RepoDigests": digests})
    assert aptlock.base_source("127.0.0.1:5000/library/debian") == f"127.0.0.1:5000/library/debian@{ours}"
    assert aptlock.base_source("127.0.0.1:5000/library/debian:bookworm-slim") == \
        f"127.0.0.1:5000/library/debian:bookworm-slim@{ours}"
    digests[:] = [f"mirror.example/library/debian@{other}", f"debian@{ours}"]
    assert aptlock.base_source("docker.io/library/debian:bookworm-slim").endswith(f":bookworm-slim@{ours}")
    for listed in ([f"mirror.example/library/debian@{other}"], []):
        digests[:] = listed
        with pytest.raises(FailedError, match=r"^the base 127.0.0.1:5000/library/debian in the engine has no digest "
                                              r"of its repository 127.0.0.1:5000/library/debian \(built here"):
            aptlock.base_source("127.0.0.1:5000/library/debian")

def test_a_locked_version_debian_no_longer_serves_is_one_line_naming_make_lock(tmp_path: Path):
    log = tmp_path / "build.log"
    log.write_text("#7 [2/8] RUN --mount=type=tmpfs,target=/run touch /run/stamp ...\n"
                   "#7 3.120 Reading package lists...\n"
                   "#7 3.301 E: Version '3.0.11-1~deb12u2' for 'openssl' was not found\n"
                   "#7 ERROR: executor failed running [/bin/bash -o pipefail -c ...]: exit code: 123\n")
    assert last_error_line(log) == ("apt.lock pins openssl=3.0.11-1~deb12u2, which Debian no longer serves; run "
                                    "`make lock` (FRAMEWORK=<cell>) and commit the new apt.lock")


def test_fingerprint_follows_the_named_packages_and_base_not_the_base_digest():
    cell = _cell()
    assert aptlock.fingerprint(cell) == parse_apt_lock(LOCK_TEXT).inputs
    assert aptlock.fingerprint(dataclasses.replace(cell, apt_packages=("procps",))) != aptlock.fingerprint(cell)
    assert entries_digest({"a": "1"}) != entries_digest({"a": "2"})


def test_the_unlocked_package_error_is_the_summary_not_the_step_header_that_echoes_it(tmp_path: Path):
    """BuildKit's step header repeats the RUN command, whose `echo "ERROR: ..."` must not be taken for the error."""
    log = tmp_path / "build.log"
    log.write_text('#5 [2/2] RUN touch /run/stamp && if [ -s /run/unlocked ]; then echo "ERROR: apt added $(paste '
                   '-sd \' \' /run/unlocked), which apt.lock does not list"; fi\n'
                   "#5 9.870 ERROR: apt added media-types=10.0.0, which apt.lock does not list (another base than it "
                   "was resolved in); run make lock FRAMEWORK=pytorch-cpu:2.13\n"
                   "#5 ERROR: executor failed running [/bin/bash -o pipefail -c ...]: exit code: 1\n")
    assert last_error_line(log) == ("#5 9.870 ERROR: apt added media-types=10.0.0, which apt.lock does not list "
                                    "(another base than it was resolved in); run make lock "
                                    "FRAMEWORK=pytorch-cpu:2.13")


# -- the .debs' hashes (the SBOM's) -------------------------------------------------------------------------

def test_debs_sha256_lists_every_package_with_its_hash_or_says_not_served():
    text = aptlock.deb_hashes_text({"bash": "5.2", "procps": "2:4.0.2-3"}, {"procps=2:4.0.2-3": "c" * 64})
    assert text.splitlines()[2:] == ["bash=5.2 -", "procps=2:4.0.2-3 " + "c" * 64]
    assert parse_deb_hashes(text, "debs.sha256") == {"bash=5.2": "-", "procps=2:4.0.2-3": "c" * 64}


@pytest.mark.parametrize("line, why", [("procps=2:4.0.2-3", "is not `name=version <sha256 or ->`"),
                                       ("procps=2:4.0.2-3 " + "c" * 63, "is not `name=version"),
                                       ("procps=2:4.0.2-3 " + "C" * 64, "is not `name=version")])
def test_a_malformed_hash_line_is_refused_naming_it(line: str, why: str):
    with pytest.raises(ValueError, match=f"debs.sha256 line 1: .* {re.escape(why)}"):
        parse_deb_hashes(line + "\n", "debs.sha256")


@pytest.mark.parametrize("edit, why", [
    (lambda t: t.replace(t.splitlines()[3] + "\n", ""), "missing"),                       # a package's line deleted
    (lambda t: t + "zlib1g=9:9 " + "d" * 64 + "\n", "zlib1g=9:9 not locked"),              # a line added
    (lambda t: t.replace(t.splitlines()[3].split(" ")[0], t.splitlines()[3].split(" ")[0] + "x", 1), "missing"),
])
def test_debs_sha256_that_is_not_the_locks_fails_the_offline_check(project: Path, edit, why):
    path = project / "dockerfiles/pytorch/pytorch-cpu/2.13/debs.sha256"
    path.write_text(edit(path.read_text()))
    problems = aptlock.check_cell(project, _cell())
    assert any("debs.sha256 does not list exactly the packages of base.dpkg and apt.lock" in p and why in p
               and "make lock" in p for p in problems), problems


def test_a_missing_debs_sha256_fails_the_offline_check(project: Path):
    (project / "dockerfiles/pytorch/pytorch-cpu/2.13/debs.sha256").unlink()
    problems = aptlock.check_cell(project, _cell())
    assert any("debs.sha256 is missing (the SBOM's hashes of the Debian packages)" in p for p in problems), problems


def test_a_single_platform_lock_is_resolved_in_the_registrys_image_not_the_engines_tag(monkeypatch,
                                                                                        tmp_path: Path):
    """The engine may keep an older image under the base's tag (the mirror was made again: a new recipe): `make
    lock` ran the probe in that one and recorded it as `resolved-in`, a base no build uses. It asks the registry
    for the tag's image of the cell's platform and runs the probe, and records the base, by that digest; the
    drift check re-resolves in the same one."""
    cell = _cell()
    assert not cell.multi_platform
    tag = "127.0.0.1:5000/library/debian:bookworm-slim"
    pinned = "127.0.0.1:5000/library/debian@sha256:" + "e" * 64
    asked: list[tuple[str, str]] = []
    probed: list[str] = []
    lock = parse_apt_lock(LOCK_TEXT)

    def platform_base(ref: str, platform: str) -> str:
        asked.append((ref, platform))
        return pinned

    def probe(ref: str, install: list[str], prefs: str = "", platform: str | None = None) -> aptlock.Probe:
        probed.append(ref)
        return _probe(dict(lock.entries), {"bash": "5.2.15-2+b13"})

    monkeypatch.setattr(aptlock, "platform_base", platform_base)
    monkeypatch.setattr(aptlock, "run_probe", probe)
    monkeypatch.setattr(aptlock, "base_source", lambda ref: f"{ref} (mmdebstrap, recipe 4)")
    (tmp_path / Path(cell.dockerfile).parent).mkdir(parents=True)
    write_changed(aptlock.lock_texts(tmp_path, cell, tag, log=lambda line: None))
    assert asked == [(tag, "linux/amd64")] and probed == [pinned]
    assert aptlock.read(tmp_path, cell).header["resolved-in"] == f"{pinned} (mmdebstrap, recipe 4)"
    assert aptlock.cell_drift(tmp_path, cell, tag, log=lambda line: None) == []
    assert asked[-1] == (tag, "linux/amd64") and probed[-1] == pinned


def test_a_base_tag_holding_no_image_is_one_line_naming_it(monkeypatch):
    """A tag holding a manifest without a config (an OCI artifact, or a Docker schema 1 manifest) ended `make lock`
    in a KeyError traceback; now one line naming the base and its manifest's media type. An image still resolves."""
    import json

    from buildtool.common.errors import FailedError
    from buildtool.registry import client as registry_client
    from tests.memregistry import MemRegistry

    registry = MemRegistry()
    monkeypatch.setattr(registry_client, "RegistryClient", lambda host, **_: registry)
    image = registry.push_image("library/debian", "bookworm-slim")
    assert aptlock.platform_base(f"{registry.host}/library/debian:bookworm-slim", "linux/amd64") == (
        f"{registry.host}/library/debian@{image}")
    artifact = "application/vnd.oci.artifact.manifest.v1+json"
    for media_type, manifest in ((artifact, {"mediaType": artifact, "artifactType": "application/x-sbom", "blobs": []}),
                                 ("application/vnd.oci.image.manifest.v1+json", {"schemaVersion": 2, "layers": []}),
                                 ("", {"schemaVersion": 1, "fsLayers": [], "config": {"size": 2}})):
        registry.put_manifest("library/debian", "odd", json.dumps(manifest).encode(), media_type)
        with pytest.raises(FailedError) as caught:
            aptlock.platform_base(f"{registry.host}/library/debian:odd", "linux/amd64")
        assert str(caught.value) == (f"the base {registry.host}/library/debian:odd is no image: its manifest "
                                     f"({media_type or 'no media type'}) has no config digest (an artifact?); mirror "
                                     "the base for linux/amd64 (`make bases`)")
