"""The base made here (mmdebstrap) ships what keeps the layers built on it reproducible, dated by the archive state
it was made from and checked to be made from it (no engine, no registry, no archive: fakes of each)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import label_keys, platforms
from buildtool.imagebuild import bases, builder, rootfs_seal
from buildtool.imagebuild.builder import BaseInfo, Builder, BuildOptions
from tests.conftest import fixture_matrix
from tests.memregistry import MemRegistry

RELEASE_DATE = "Sat, 11 Jul 2026 10:16:37 UTC"
EPOCH = 1783764997  # RELEASE_DATE as Unix time
LIST = "var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease"
IN_RELEASE = f"-----BEGIN PGP SIGNED MESSAGE-----\nOrigin: Debian\nSuite: stable\nDate: {RELEASE_DATE}\n".encode()
ARCHIVE_URL = "http://deb.debian.org/debian/dists/bookworm/InRelease"


def fake_tree(rootfs: Path, release: bytes | None = IN_RELEASE) -> None:
    """What mmdebstrap leaves: files written now, the build host's resolv.conf and hostname, no hosts, the
    InRelease it read in the lists (kept: --skip=cleanup/apt/lists)."""
    for name in ("etc/passwd", "usr/bin/true", "var/lib/apt/lists/partial/x"):
        (rootfs / name).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / name).write_text("x\n")
    (rootfs / "etc/resolv.conf").write_text("nameserver 10.255.255.53\n")
    (rootfs / "etc/hostname").write_text("buildhost\n")
    (rootfs / "etc/resolv.conf").chmod(0o755)
    (rootfs / "etc/localtime").symlink_to("/usr/share/zoneinfo/Etc/UTC")
    if release is not None:
        (rootfs / LIST).write_bytes(release)


@pytest.fixture
def mmdebstrap_here(monkeypatch, tmp_path):
    """_make_platform with a fake mmdebstrap (it leaves `read`, the InRelease it read: the archive's unless a test
    says otherwise) and a fake archive; returns what was written to the registry (tree, config, command)."""
    seen: dict[str, object] = {"read": IN_RELEASE}

    def run(argv, **kwargs):
        seen["argv"], seen["epoch"] = argv, kwargs["env"]["SOURCE_DATE_EPOCH"]
        fake_tree(Path(argv[-2]), seen["read"])   # type: ignore[arg-type]
        return subprocess.CompletedProcess(argv, 0)

    def rootfs_image(client, repo, rootfs, platform, *, epoch, cmd, labels, created_by):
        seen["tree"] = {str(p.relative_to(rootfs)): p.lstat() for p in [rootfs, *rootfs.rglob("*")]}
        seen["text"] = {n: (rootfs / n).read_text() for n in rootfs_seal.RUNTIME_FILES if (rootfs / n).exists()}
        seen.update(platform=platform, epoch_written=epoch, labels=labels, created_by=created_by)
        return SimpleNamespace(digest="sha256:" + "c" * 64)

    monkeypatch.setattr(bases.shutil, "which", lambda name: "/usr/bin/mmdebstrap")
    monkeypatch.setattr(bases.subprocess, "run", run)
    monkeypatch.setattr(bases.base_index, "rootfs_image", rootfs_image)
    monkeypatch.setattr(bases.platforms, "host", lambda: platforms.get("linux/amd64"))

    def make(platform: str = "linux/amd64", read: bytes = IN_RELEASE) -> dict[str, object]:
        seen["read"] = read
        state = bases.read_archive_state("http://deb.debian.org/debian", "bookworm", lambda uri: IN_RELEASE)
        bases._make_platform(SimpleNamespace(host="r:5000"), "library/debian", "bookworm", True,  # type: ignore[arg-type]
                             platform, state, print, bases.LogFile(tmp_path / "log"))
        return seen
    return make


def test_base_ships_runtime_files_with_the_release_time(mmdebstrap_here):
    seen = mmdebstrap_here()
    tree = seen["tree"]
    for name in ("etc/hosts", "etc/resolv.conf", "etc/hostname"):
        assert name in tree, f"{name} missing: every RUN would create it and move /etc's mtime"
        assert (tree[name].st_mtime, tree[name].st_mode & 0o7777, tree[name].st_uid) == (EPOCH, 0o644, 0), name
        assert seen["text"][name] == "", f"{name} carries the build host's copy"
    assert tree["etc"].st_mtime == EPOCH
    newer = sorted(name for name, st in tree.items() if st.st_mtime > EPOCH)
    assert newer == [], f"mtimes after the suite's InRelease date: {newer}"
    assert LIST not in tree, "the lists mmdebstrap kept (to check which InRelease it read) are left in the base"


def test_mmdebstrap_runs_with_the_archive_states_date_and_the_base_says_which_state(mmdebstrap_here):
    seen = mmdebstrap_here()
    assert seen["epoch"] == str(EPOCH) and seen["epoch_written"] == EPOCH
    assert seen["argv"] == ["mmdebstrap", "--mode=root", "--variant=minbase", "--format=directory",
                            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", "--skip=cleanup/apt/lists",
                            "bookworm", seen["argv"][-2], "http://deb.debian.org/debian"]
    assert seen["labels"] == {
        label_keys.BASE_SOURCE: "mmdebstrap --variant=minbase bookworm, recipe 4",
        label_keys.BASE_ARCHIVE: f"{ARCHIVE_URL} sha256:{hashlib.sha256(IN_RELEASE).hexdigest()} "
                                 "2026-07-11T10:16:37Z"}
    arm = mmdebstrap_here("linux/arm64")
    assert "--architectures=arm64" in arm["argv"] and arm["platform"] == "linux/arm64"
    assert arm["labels"][label_keys.BASE_SOURCE] == ("mmdebstrap --architectures=arm64 --variant=minbase bookworm, "
                                                     "recipe 4")


def test_a_slim_base_keeps_what_its_dpkg_filter_includes(mmdebstrap_here, monkeypatch):
    """A -slim base is what its dpkg filter (SLIM_EXCLUDES) would have installed, as Docker's slim images are:
    docs, man pages and translations out, each package's copyright and /usr/share/locale/locale.alias (which
    glibc's locale functions read) kept."""
    made = bases.subprocess.run
    docs = ("usr/share/locale/locale.alias", "usr/share/locale/de/LC_MESSAGES/dpkg.mo", "usr/share/man/man1/ls.1.gz",
            "usr/share/info/dir", "usr/share/doc/bash/copyright", "usr/share/doc/bash/changelog.gz",
            "usr/share/doc/bash/examples/x")

    def run(argv, **kwargs):
        done = made(argv, **kwargs)
        for name in docs:
            (Path(argv[-2]) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(argv[-2]) / name).write_text("x\n")
        return done

    monkeypatch.setattr(bases.subprocess, "run", run)
    tree = mmdebstrap_here()["tree"]
    assert sorted(name for name in docs if name in tree) == ["usr/share/doc/bash/copyright",
                                                             "usr/share/locale/locale.alias"]
    assert {"usr/share/locale", "usr/share/man", "usr/share/info", "etc/dpkg/dpkg.cfg.d/docker-slim"} <= set(tree)


def test_an_archive_that_moved_while_the_base_was_made_is_refused(mmdebstrap_here):
    """mmdebstrap read another InRelease than the one the base is dated and labelled by: two machines could not
    agree on it, so no base is written."""
    later = IN_RELEASE.replace(b"10:16:37", b"11:16:37")
    with pytest.raises(FailedError, match="mmdebstrap read [0-9a-f]{64} InRelease of bookworm, not the "
                                          ".*the archive moved while the base was made"):
        mmdebstrap_here(read=later)


def test_a_release_file_without_a_date_cannot_date_a_base():
    with pytest.raises(FailedError, match="not a Debian release file"):
        bases.read_archive_state("http://deb.debian.org/debian", "bookworm", lambda uri: b"Origin: Debian\n")


def test_an_archive_setting_with_credentials_or_no_url_is_refused(monkeypatch):
    for bad in ("deb.debian.org/debian", "http://user:pw@mirror.example/debian", "http://m.example/debian?t=1"):
        monkeypatch.setenv(bases.ARCHIVE_ENV, bad)
        with pytest.raises(UserError, match="DEBIAN_ARCHIVE: .*not an http\\(s\\) URL of a Debian archive"):
            bases.debian_archive()
    monkeypatch.setenv(bases.ARCHIVE_ENV, "http://snapshot.debian.org/archive/debian/20261201T000000Z/")
    assert bases.debian_archive() == "http://snapshot.debian.org/archive/debian/20261201T000000Z"


def test_an_archive_token_holding_a_slash_is_refused_and_never_shown(monkeypatch):
    """`https://tok3n/s3cr3t@mirror/debian`: a URL parser reads host `tok3n` and the path `/s3cr3t@mirror/debian`, so
    public_url kept it whole: the setting was taken (the token into mmdebstrap's log and the base's label), or, with
    a capital letter in it, refused with the token in the message. It is refused now, naming the URL without it."""
    for token in ("tok3n/s3cr3t", "Tok3n/S3cr3t"):
        monkeypatch.setenv(bases.ARCHIVE_ENV, f"https://{token}@mirror.example/debian")
        with pytest.raises(UserError) as refused:
            bases.debian_archive()
        said = str(refused.value)
        assert "3cr3t" not in said and "ok3n" not in said, said
        assert said.startswith("DEBIAN_ARCHIVE: https://mirror.example/debian is not an http(s) URL"), said


def test_seal_leaves_older_mtimes_and_symlink_targets_alone(tmp_path):
    fake_tree(tmp_path)
    os.utime(tmp_path / "usr/bin/true", (1000, 1000))
    rootfs_seal.seal(tmp_path, EPOCH)
    assert (tmp_path / "usr/bin/true").stat().st_mtime == 1000
    assert (tmp_path / "etc/localtime").lstat().st_mtime == EPOCH
    assert (tmp_path / "etc/hosts").read_bytes() == b""



def test_a_platforms_base_is_labelled_the_same_whichever_machine_makes_it(mmdebstrap_here, monkeypatch):
    """The BASE_SOURCE label (in the base's config, so its digest) named `--architectures=` only where the platform
    was not the machine's own: an arm64 machine made another arm64 base digest than an amd64 machine from one
    archive state, and each machine judged the other's base an older recipe and made it again."""
    made = {}
    for host in ("linux/amd64", "linux/arm64"):
        monkeypatch.setattr(bases.platforms, "host", lambda host=host: platforms.get(host))
        for platform in ("linux/amd64", "linux/arm64"):
            seen = mmdebstrap_here(platform)
            made[host, platform] = (dict(seen["labels"]), seen["created_by"])   # type: ignore[call-overload]
    for platform in ("linux/amd64", "linux/arm64"):
        assert made["linux/amd64", platform] == made["linux/arm64", platform], platform
        children = {platform: SimpleNamespace(labels=made["linux/amd64", platform][0])}
        logged: list[str] = []
        assert bases._stale(children, [platform], "r:5000/library/debian:bookworm-slim", "bookworm",   # type: ignore[arg-type]
                            logged.append) == [], logged


@pytest.mark.parametrize(("found", "kept"), [
    ("mmdebstrap --variant=minbase bookworm, recipe 4", True),
    ("mmdebstrap --variant=minbase bookworm, recipe 3", False),   # a -slim base without locale.alias
    ("debootstrap --variant=minbase bookworm, recipe 2", False),  # debootstrap: another base on every machine
    ("debootstrap --variant=minbase bookworm", False),      # made before the runtime files were shipped
    (None, True),                                           # not made here (a mirror of the upstream): kept
])
def test_base_of_an_older_recipe_is_made_again(monkeypatch, found, kept):
    monkeypatch.setattr(bases, "registry_base_source", lambda ref: found)
    logged: list[str] = []
    assert bases._made_by_recipe("r:5000/library/debian:bookworm-slim", "bookworm", logged.append) is kept
    assert bool(logged) is not kept and all("making it again" in line for line in logged)


def _repro_bench():
    spec = importlib.util.spec_from_file_location("repro_build", Path(__file__).parents[1] / "bench/repro_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_says_why_image_digests_differ():
    bench = _repro_bench()
    one = {"created": "t1", "history": [{"created": "t1", "created_by": "RUN a"}], "config": {"Env": ["A=1"]}}
    engine_only = {**one, "created": "t2", "history": [{"created": "t2", "created_by": "RUN a"}]}
    assert bench.config_differences(one, engine_only) == ["created", "history[].created"]
    assert bench.image_verdict(bench.config_differences(one, engine_only))["reason"] == bench.ENGINE_REASON
    ours = {**engine_only, "config": {"Env": ["A=2"]}}
    verdict = bench.image_verdict(bench.config_differences(one, ours))
    assert verdict["differing_fields"] == ["config.Env[]", "created", "history[].created"]
    assert "a cause in this project" in verdict["reason"]
    assert bench.image_verdict([]) == {"identical": True, "reason": "configs equal"}


def test_build_remakes_a_base_of_an_older_recipe_and_keeps_a_mirrored_one(monkeypatch):
    cells = {c.key: c for c in fixture_matrix().cells}
    sources = {"pytorch-cpu:2.13": "debootstrap --variant=minbase bookworm, recipe 2",   # older recipe
               "tensorflow-cpu:2.21": "mmdebstrap --variant=minbase bookworm, recipe 4",
               "pytorch-ngc:25.10": None}                                             # a mirror's copy
    plans = [SimpleNamespace(cell=cells[key], base=f"127.0.0.1:5000/{key}") for key in sources]
    by_base = {p.base: sources[p.cell.key] for p in plans}
    registry = MemRegistry("127.0.0.1:5000")
    for plan in plans:     # each base tag: an image whose BASE_SOURCE label says which recipe made it
        repo, _, tag = plan.base.split("/", 1)[1].partition(":")
        source = by_base[plan.base]
        registry.push_image(repo, tag, payload=plan.base.encode(),
                            labels=None if source is None else {label_keys.BASE_SOURCE: source})
    monkeypatch.setattr(bases, "RegistryClient", lambda host, **_: registry)
    filled: list[str] = []
    monkeypatch.setattr(builder, "resolve_base", lambda plan: BaseInfo(
        ref=plan.base, digest="sha256:" + "a" * 64,
        labels={} if by_base[plan.base] is None else {label_keys.BASE_SOURCE: by_base[plan.base]}))
    monkeypatch.setattr(builder, "fill_bases", lambda cells, *a, **k: filled.extend(c.key for c in cells))
    run = object.__new__(Builder)
    run.settings, run.options, run.log = builder.Settings(base_mirror="127.0.0.1:5000"), BuildOptions(), print
    run.root = Path(__file__).resolve().parents[1]
    infos, missing = run.resolve_bases(plans)  # type: ignore[arg-type]
    assert filled == ["pytorch-cpu:2.13"] and missing == {} and len(infos) == 3


def test_a_build_says_when_its_apt_lock_was_resolved_in_another_base():
    """The apt lock names the base it was resolved in (by digest, reproducible now): a build on another one (the
    archive moved since `make lock`) says so; on that base it says nothing."""
    from buildtool.contracts.apt_lock_format import parse_apt_lock

    root = Path(__file__).resolve().parent / "fixtures/project"
    cell = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
    lock = parse_apt_lock((root / Path(cell.dockerfile).parent / "apt.lock").read_text())
    resolved = lock.header["resolved-in"].split(" ", 1)[0].rpartition("@")[2]
    run = object.__new__(Builder)
    logged: list[str] = []
    run.root, run.log = root, logged.append
    plan = SimpleNamespace(cell=cell)
    run._say_lock_base(plan, BaseInfo("127.0.0.1:5000/library/debian:bookworm-slim", resolved), None)  # type: ignore[arg-type]
    assert logged == []
    run._say_lock_base(plan, BaseInfo("127.0.0.1:5000/library/debian:bookworm-slim", "sha256:" + "c" * 64),  # type: ignore[arg-type]
                       None)
    assert logged == [f"[pytorch-cpu:2.13] note: its apt lock was resolved in base {resolved[:19]}, this build's base "
                      f"is sha256:{'c' * 12} (another archive state: `make lock FRAMEWORK=pytorch-cpu:2.13` resolves "
                      "it in this one)"]


def test_a_slim_bases_dpkg_filter_has_the_same_mode_under_any_umask(mmdebstrap_here):
    """_slim wrote etc/dpkg/dpkg.cfg.d/docker-slim with the mode the process's umask left (0600 under 077, 0640
    under a hardened root's 027): the base's layer, so its digest and every image's built on it, depended on the
    machine that made it."""
    old = os.umask(0o077)
    try:
        tree = mmdebstrap_here()["tree"]
    finally:
        os.umask(old)
    assert tree["etc/dpkg/dpkg.cfg.d/docker-slim"].st_mode & 0o7777 == 0o644


def test_a_stand_in_is_built_from_its_debian_base_by_digest(monkeypatch, tmp_path):
    """A single-platform stand-in was built FROM the mirror's Debian tag: the engine's BuildKit resolves a tag
    from its own image store first, so a machine holding an older image of that tag (pulled, or a base of an
    earlier recipe) built the stand-in, and every image on it, on another base than the registry's."""
    cell = next(c for c in fixture_matrix().cells if c.key == "pytorch-ngc:25.01")
    debian = "sha256:" + "d" * 64
    built: list[dict[str, str]] = []
    monkeypatch.setattr(bases, "RegistryClient", lambda host: SimpleNamespace(ping=lambda: None))
    monkeypatch.setattr(bases.engine, "sdk", lambda: None)
    monkeypatch.setattr(bases, "_debian_base", lambda *args, **kwargs: [])
    monkeypatch.setattr(bases, "registry_digest", lambda ref: debian if "/library/debian:" in ref else None)
    monkeypatch.setattr(bases, "_build_standin", lambda cell, text, args, tag, log: built.append(args))
    monkeypatch.setattr(bases, "push_verified", lambda ref, log: "sha256:" + "e" * 64)
    bases.fill_bases([cell], "127.0.0.1:5000", force=False, log=print, log_dir=tmp_path, templates=tmp_path)
    assert built == [{"BASE_IMAGE": f"127.0.0.1:5000/library/debian@{debian}"}]


def test_a_debian_bases_log_is_private_and_masked_as_an_image_build_log_is(mmdebstrap_here, monkeypatch, tmp_path):
    """mmdebstrap's log (build-logs/base-debian-<suite>-<arch>.log) was opened with the umask's mode (0644: every
    local user could read it) and written raw, while an image's build log is 0600 and masked line by line. It is
    written through the same writer now: 0600 (an earlier run's 0644 file too), the base's -slim sibling's lines
    kept (both append to one log), each line masked before it reaches the file."""
    log = tmp_path / "log"
    log.write_text("the -slim sibling's run\n")
    log.chmod(0o644)
    old = os.umask(0o022)
    try:
        mmdebstrap_here()
    finally:
        os.umask(old)
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.read_text().startswith("the -slim sibling's run\n")
    token = "s3cr3tTOKEN"
    fake_run = bases.subprocess.run

    def printing(argv, **kwargs):
        kwargs["stdout"].write(f"I: Get https://user:{token}@mirror.example.invalid/debian bookworm\n")
        kwargs["stdout"].flush()
        return fake_run(argv, **kwargs)

    monkeypatch.setattr(bases.subprocess, "run", printing)
    state = bases.read_archive_state("http://deb.debian.org/debian", "bookworm", lambda uri: IN_RELEASE)
    bases._make_platform(SimpleNamespace(host="r:5000"), "library/debian", "bookworm", True,  # type: ignore[arg-type]
                         "linux/amd64", state, print, bases.LogFile(log, [token]))
    assert "I: Get https://user:****@mirror.example.invalid/debian bookworm\n" in log.read_text()
    assert token not in log.read_text() and log.stat().st_mode & 0o777 == 0o600


def test_a_netrc_login_never_goes_to_the_archive_nor_where_it_redirects(monkeypatch: pytest.MonkeyPatch,
                                                                         netrc_default_login: str) -> None:
    """The release file was fetched with requests' defaults: ~/.netrc's login for the archive's host (its `default`
    entry for any host) went to the archive, over plain HTTP, and again to wherever it redirected; the URLs come
    from the build log, and the build's apt never had that login."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from buildtool.imagebuild import archive_state

    seen: list[str | None] = []

    class Archive(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization"))
            moved = self.path.startswith("/old/")
            self.send_response(302 if moved else 200)
            if moved:   # another host name for the same server: requests reads the netrc again for it
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/debian/InRelease")
            self.send_header("Content-Length", "0" if moved else str(len(IN_RELEASE)))
            self.end_headers()
            self.wfile.write(b"" if moved else IN_RELEASE)

        def log_message(self, *args: object) -> None:
            pass

    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Archive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = archive_state.get(f"http://127.0.0.1:{server.server_address[1]}/old/InRelease")
    finally:
        server.shutdown()
        server.server_close()
    assert got == IN_RELEASE and seen == [None, None], seen
