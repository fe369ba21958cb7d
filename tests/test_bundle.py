"""`buildtool bundle`: the config fitted to the run profile (pure), and the whole command with stand-ins for
skopeo and umoci on PATH that write what the real ones write (an OCI layout; rootfs + umoci's config.json).
The real tools, a real image and SLURM running the bundle are in tests/integration/test_slurm_cluster.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys
from buildtool.launch.bundle import (
    JOBS_MOUNT,
    UNLIMITED,
    Profile,
    fit_config,
    parse_ulimits,
    profile_from_labels,
    shm_bytes,
)

REPO = Path(__file__).resolve().parent.parent
IMAGE = "127.0.0.1:5000/t/pytorch-cpu-dev:abc-2.13"
PROFILE = {"shm_size": "8g", "ipc": "private", "ulimits": {"memlock": -1, "stack": 67108864}, "gpus": "none"}

# What umoci 0.4 writes (trimmed): a terminal, its own hostname, every namespace, a 64 MB /dev/shm, nofile 1024.
UMOCI_CONFIG = {
    "ociVersion": "1.0.0",
    "process": {"terminal": True, "user": {"uid": 0, "gid": 0}, "args": ["bash"],
                "env": ["PATH=/opt/venv/bin:/usr/bin:/bin", "HOME=/root"], "cwd": "/workspace",
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
    "root": {"path": "rootfs"},
    "hostname": "umoci-default",
    "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
               {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}],
    "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]},
}


def test_the_config_follows_the_profile(tmp_path: Path) -> None:
    profile = profile_from_labels({label_keys.RUN_PROFILE: json.dumps(PROFILE)})
    assert profile == Profile(shm_size="8g", ulimits=(("memlock", -1), ("stack", 67108864)), gpus=False,
                              ipc_host=False, source=f"the image's {label_keys.RUN_PROFILE} label")
    bundle = tmp_path / "b"
    cfg = fit_config(UMOCI_CONFIG, bundle, profile, hosts=False, jobs_dir=None)
    assert cfg["process"]["terminal"] is False and "hostname" not in cfg
    assert [ns["type"] for ns in cfg["linux"]["namespaces"]] == ["ipc", "mount"]
    assert cfg["root"] == {"path": "rootfs", "readonly": True}
    assert cfg["process"]["rlimits"] == [
        {"type": "RLIMIT_MEMLOCK", "hard": UNLIMITED, "soft": UNLIMITED},
        {"type": "RLIMIT_STACK", "hard": 67108864, "soft": 67108864}]  # and umoci's nofile 1024 is gone
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts["/dev/shm"]["options"] == ["nosuid", "nodev", "mode=1777", f"size={8 << 30}"]
    assert mounts["/etc/hosts"]["source"] == "/etc/hosts" and mounts["/etc/resolv.conf"]["source"] == "/etc/resolv.conf"
    assert mounts["/tmp"]["type"] == "tmpfs"
    assert mounts[JOBS_MOUNT] == {"destination": JOBS_MOUNT, "type": "bind", "source": str(bundle / "jobs"),
                                  "options": ["rbind", "ro"]}
    assert UMOCI_CONFIG["hostname"] == "umoci-default"  # the input is left alone


def test_gpu_ipc_host_hosts_file_writable_and_jobs_elsewhere(tmp_path: Path) -> None:
    profile = Profile(shm_size="1g", gpus=True, ipc_host=True)
    cfg = fit_config(UMOCI_CONFIG, tmp_path / "b", profile, hosts=True, jobs_dir=Path("/scratch/jobs"),
                     read_only=False)
    assert [ns["type"] for ns in cfg["linux"]["namespaces"]] == ["mount"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in cfg["process"]["env"]
    mounts = {m["destination"]: m for m in cfg["mounts"]}
    assert mounts["/etc/hosts"]["source"] == str(tmp_path / "b" / "hosts") and "/etc/resolv.conf" not in mounts
    assert "/tmp" not in mounts and cfg["root"]["readonly"] is False
    assert mounts[JOBS_MOUNT]["source"] == "/scratch/jobs"


def test_values() -> None:
    assert shm_bytes("8g") == 8 << 30 and shm_bytes("512M") == 512 << 20 and shm_bytes("4096") == 4096
    for bad in ("", "g", "1.5g", "8t", " 8g"):      # the one size grammar (tests/test_sizes.py), named
        with pytest.raises(UserError, match=f"--shm-size: {bad!r} is not a size"):
            shm_bytes(bad)
    assert parse_ulimits(["memlock=8388608", "stack=-1"]) == (("memlock", 8388608), ("stack", -1))
    for bad in ("memlock", "heap=1", "stack=big"):
        with pytest.raises(UserError, match="--ulimit"):
            parse_ulimits([bad])
    assert profile_from_labels({}) is None
    for broken, cause in (("not json", "is not a JSON object"), ('{"shm_size": "lots"}', "'lots' is not a size")):
        with pytest.raises(UserError, match=f"the image's label {label_keys.RUN_PROFILE}.*{cause}"):
            profile_from_labels({label_keys.RUN_PROFILE: broken})
    for broken in ("[]", '{"shm_size": 8}', '{"shm_size": "8g", "ulimits": {"stack": "big"}}'):
        with pytest.raises(UserError) as caught:       # a label that does not parse is no missing label
            profile_from_labels({label_keys.RUN_PROFILE: broken})
        assert str(caught.value).startswith(f"the image's label {label_keys.RUN_PROFILE}"), caught.value
    with pytest.raises(UserError, match="has no OCI rlimit"):
        fit_config(UMOCI_CONFIG, Path("/b"), Profile(shm_size="1g", ulimits=(("heap", 1),)), hosts=False,
                   jobs_dir=None)


# -- the command, with skopeo and umoci stand-ins ----------------------------------------------------------

SKOPEO = r'''#!/usr/bin/env python3
"""skopeo copy [--quiet] [--src-tls-verify=false] docker://IMAGE oci:DIR:TAG -> an OCI layout in DIR."""
import hashlib, json, os, sys
args = [a for a in sys.argv[1:] if not a.startswith("--")]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(" ".join(["skopeo", *sys.argv[1:]]) + "\n")
if os.environ.get("STUB_FAIL") == "skopeo":
    print("manifest unknown", file=sys.stderr); sys.exit(1)
layout = args[2].split(":")[1]
blobs = os.path.join(layout, "blobs", "sha256")
os.makedirs(blobs)
def put(doc):
    data = json.dumps(doc).encode()
    digest = hashlib.sha256(data).hexdigest()
    open(os.path.join(blobs, digest), "wb").write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}
# An index's manifest of the platform asked for (--override-arch), or a single image of STUB_ARCH.
chosen = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--override-"))
arch = os.environ.get("STUB_ARCH") or chosen.get("override-arch", "amd64")
declared = json.loads(os.environ.get("STUB_PLATFORM") or "null") or {"architecture": arch,
                                                                    "os": chosen.get("override-os", "linux")}
config = put({**declared, "config": {"Labels": json.loads(os.environ["STUB_LABELS"])}})
manifest = put({"schemaVersion": 2, "config": config, "layers": []})
json.dump({"schemaVersion": 2, "manifests": [manifest]}, open(os.path.join(layout, "index.json"), "w"))
'''
UMOCI = r'''#!/usr/bin/env python3
"""umoci unpack --image LAYOUT:TAG BUNDLE -> BUNDLE/rootfs and umoci's config.json."""
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(" ".join(["umoci", *sys.argv[1:]]) + "\n")
bundle = sys.argv[-1]
os.makedirs(os.path.join(bundle, "rootfs", "opt", "venv", "bin"))
json.dump(json.loads(os.environ["STUB_CONFIG"]), open(os.path.join(bundle, "config.json"), "w"))
if os.environ.get("STUB_FAIL") == "umoci":
    print("layer digest mismatch", file=sys.stderr); sys.exit(1)
'''


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in (("skopeo", SKOPEO), ("umoci", UMOCI)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    log = tmp_path / "stub.log"
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    monkeypatch.setenv("STUB_LOG", str(log))
    monkeypatch.setenv("STUB_LABELS", json.dumps({label_keys.RUN_PROFILE: json.dumps(PROFILE)}))
    monkeypatch.setenv("STUB_CONFIG", json.dumps(UMOCI_CONFIG))
    return log


def test_an_image_by_tag_and_digest_is_copied_by_its_digest(run_cli, tools: Path, tmp_path: Path) -> None:
    """skopeo (containers/image) refuses a reference with a tag and a digest ("Docker references with both a tag and
    digest are currently not supported"): `buildtool bundle NAME:TAG@sha256:...` failed. The digest goes alone."""
    digest = "sha256:" + "ab" * 32
    code, _, err = run_cli("bundle", f"{IMAGE}@{digest}", str(tmp_path / "b"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    copy = tools.read_text().splitlines()[0].split()
    assert f"docker://{IMAGE.rsplit(':', 1)[0]}@{digest}" in copy, copy


def test_bundle_command_end_to_end(run_cli, tools: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.1.1 n1\n")
    dest = tmp_path / "site" / "bundle"
    code, out, err = run_cli("bundle", IMAGE, str(dest), "--hosts", str(hosts), "--ulimit", "memlock=8388608",
                             "--json", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    made = json.loads(out)
    assert made["path"] == str(dest) and made["shm_size"] == "8g" and made["shm_bytes"] == 8 << 30
    assert made["ulimits"] == {"memlock": 8388608, "stack": 67108864}
    assert made["profile_source"] == f"the image's {label_keys.RUN_PROFILE} label, --ulimit memlock=8388608"
    assert made["digest"].startswith("sha256:") and len(made["digest"]) == 71
    copy, unpack = tools.read_text().splitlines()
    # A loopback registry speaks plain http; the layout sits in a temporary folder beside DEST.
    assert re.fullmatch(rf"skopeo --override-os=linux --override-arch=amd64 copy --quiet --src-tls-verify=false "
                        rf"docker://{re.escape(IMAGE)} "
                        rf"oci:{re.escape(str(dest.parent))}/\.bundle\.tmp-\w+/layout:image", copy), copy
    assert unpack.startswith("umoci unpack --image ") and unpack.endswith("/bundle")
    cfg = json.loads((dest / "config.json").read_text())
    assert {m["destination"]: m["source"] for m in cfg["mounts"]}["/etc/hosts"] == str(dest / "hosts")
    assert (dest / "hosts").read_text() == "127.0.1.1 n1\n"
    assert (dest / "jobs").is_dir() and (dest / "jobs").stat().st_mode & 0o1777 == 0o1777
    assert json.loads((dest / "dl-images-bundle.json").read_text()) == made
    assert sorted(p.name for p in dest.parent.iterdir()) == ["bundle"], "no temporary folder left beside it"
    assert not (dest / "layout").exists()


def test_a_failed_unpack_leaves_nothing(run_cli, tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_FAIL", "umoci")
    site = tmp_path / "site"
    code, out, err = run_cli("bundle", IMAGE, str(site / "bundle"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 1 and out == "" and "umoci unpack" in err and "layer digest mismatch" in err
    assert list(site.iterdir()) == []


def test_bad_input_is_refused_before_copying(run_cli, tools: Path, tmp_path: Path) -> None:
    matrix = ["--matrix", str(REPO / "matrix.yaml")]
    taken = tmp_path / "taken"
    taken.mkdir()
    cases = [
        (["bundle", IMAGE, str(taken)], "exists; remove it or pass --force"),
        (["bundle", "Not An Image", str(tmp_path / "x")], "IMAGE:"),
        (["bundle", IMAGE, str(tmp_path / "x"), "--shm-size", "lots"], "--shm-size: 'lots' is not a size"),
        (["bundle", IMAGE, str(tmp_path / "x"), "--ulimit", "heap=1"], "--ulimit 'heap=1'"),
        (["bundle", IMAGE, str(tmp_path / "x"), "--hosts", str(tmp_path / "none")], "is not a file"),
    ]
    for args, message in cases:
        code, out, err = run_cli(*args, *matrix)
        assert code == 2 and out == "" and message in err, (args, err)
    assert not tools.exists(), "nothing was copied"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stubs", "taken"]


def test_ulimit_takes_the_advertised_soft_hard_form(run_cli, tools: Path, tmp_path: Path) -> None:
    """The argument check accepts NAME=SOFT[:HARD] (as --help says), but parse_ulimits refused SOFT:HARD ("must be
    NAME=VALUE") and took `--1` or -5 as numbers (only -1 means unlimited). SOFT:HARD now reaches the OCI config's
    rlimit (soft and hard) and the bundle's record; the rest is one line."""
    dest = tmp_path / "b"
    code, out, err = run_cli("bundle", IMAGE, str(dest), "--ulimit=memlock=1:2", "--ulimit=core=0:unlimited",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    rlimits = {r["type"]: r for r in json.loads((dest / "config.json").read_text())["process"]["rlimits"]}
    assert rlimits["RLIMIT_MEMLOCK"] == {"type": "RLIMIT_MEMLOCK", "soft": 1, "hard": 2}
    assert rlimits["RLIMIT_CORE"] == {"type": "RLIMIT_CORE", "soft": 0, "hard": UNLIMITED}
    made = json.loads((dest / "dl-images-bundle.json").read_text())
    assert made["ulimits"] == {"core": [0, -1], "memlock": [1, 2], "stack": 67108864}
    assert "ulimits core=0:-1, memlock=1:2, stack=67108864" in out and "--ulimit memlock=1:2, core=0:-1" in out
    assert parse_ulimits(["memlock=1:2", "stack=unlimited", "nofile=-1:-1"]) == (
        ("memlock", (1, 2)), ("stack", -1), ("nofile", (-1, -1)))
    for bad in ("memlock=--1", "memlock=-2", "memlock=1:-5", "memlock=1:", "memlock=1:2:3", "memlock=\uff11"):
        with pytest.raises(UserError) as caught:
            parse_ulimits([bad])
        assert str(caught.value).startswith(f"--ulimit {bad!r} must be NAME=SOFT[:HARD] with NAME one of as, "), bad
        assert str(caught.value).endswith("and SOFT, HARD whole numbers (-1 or unlimited: unlimited)"), bad
    for above in ("memlock=5:4", "memlock=-1:4"):    # runc would refuse it on every node at the job's start
        with pytest.raises(UserError, match=f"^--ulimit '{above}': the soft limit is above the hard limit; give "
                                            "SOFT <= HARD$"):
            parse_ulimits([above])


def test_an_image_without_a_profile_takes_the_cells_or_needs_shm_size(run_cli, tools: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_LABELS", "{}")
    matrix = ["--matrix", str(REPO / "matrix.yaml")]
    code, out, err = run_cli("bundle", IMAGE, str(tmp_path / "a"), "--json", *matrix)
    assert code == 0, err
    assert json.loads(out)["profile_source"] == "the matrix cell pytorch-cpu:2.13"
    unknown = ["127.0.0.1:5000/t/unknown:1", str(tmp_path / "b"), "--platform", "linux/amd64"]
    code, out, err = run_cli("bundle", *unknown, *matrix)
    assert code == 2 and f"carries no {label_keys.RUN_PROFILE} label and matches no matrix cell" in err
    assert not (tmp_path / "b").exists()
    code, out, err = run_cli("bundle", *unknown, "--shm-size", "2g", "--json", *matrix)
    assert code == 0 and json.loads(out)["shm_size"] == "2g" and json.loads(out)["profile_source"] == "--shm-size"


def test_force_replaces_a_bundle_whole(run_cli, tools: Path, tmp_path: Path) -> None:
    dest = tmp_path / "bundle"
    matrix = ["--matrix", str(REPO / "matrix.yaml")]
    assert run_cli("bundle", IMAGE, str(dest), *matrix)[0] == 0
    (dest / "jobs" / "stale").mkdir()
    code, _, err = run_cli("bundle", IMAGE, str(dest), "--force", "--shm-size", "1g", *matrix)
    assert code == 0, err
    assert not (dest / "jobs" / "stale").exists()
    assert json.loads((dest / "dl-images-bundle.json").read_text())["shm_size"] == "1g"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "stub.log", "stubs"]


def test_force_replaces_only_a_bundle_or_an_empty_folder(run_cli, tools: Path, tmp_path: Path) -> None:
    """`bundle IMAGE ~ --force` (a mistyped DEST) deleted the home folder: --force replaces a bundle (its record
    file) or an empty folder, and refuses anything else in one line, before a copy starts; nothing is touched."""
    dest = tmp_path / "home"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    code, out, err = run_cli("bundle", IMAGE, str(dest), "--force", "--shm-size", "1g",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == ""
    assert err.strip() == (f"error: {dest} is not a bundle made by `buildtool bundle` (no dl-images-bundle.json in "
                           "it): --force replaces only a bundle or an empty folder; choose another DEST"), err
    assert (dest / "notes.txt").read_text() == "mine" and [p.name for p in dest.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "stub.log").exists() or "copy" not in (tmp_path / "stub.log").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli("bundle", IMAGE, str(empty), "--force", "--shm-size", "1g",
                           "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err


def test_a_failed_force_replace_keeps_the_old_bundle(run_cli, tools: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--force moved the old bundle aside, then the new one's rename failed: the cleanup deleted the old one too
    (and the OSError was a traceback). The old bundle is put back, and the failure is one line."""
    dest = tmp_path / "bundle"
    matrix = ["--matrix", str(REPO / "matrix.yaml")]
    assert run_cli("bundle", IMAGE, str(dest), *matrix)[0] == 0
    (dest / "jobs" / "mine").mkdir()
    before = (dest / "dl-images-bundle.json").read_text()
    rename = os.rename

    def failing(src: str | Path, dst: str | Path) -> None:
        if Path(dst) == dest and Path(src).name == "bundle":   # the new bundle's final rename
            raise OSError(28, "No space left on device")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    code, out, err = run_cli("bundle", IMAGE, str(dest), "--force", "--shm-size", "1g", *matrix)
    assert code == 1 and out == ""
    assert err.strip().splitlines()[-1] == (f"failed: cannot move the new bundle into place at {dest} ([Errno 28] "
                                            "No space left on device); the old bundle is kept there"), err
    assert (dest / "dl-images-bundle.json").read_text() == before and (dest / "jobs" / "mine").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "stub.log", "stubs"]


def test_a_matrix_image_whose_tag_names_no_cell_is_exit_2_not_the_default_cells_profile(
        run_cli, tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: `-25.01` is no version of pytorch-cpu; the 2.13 cell's profile is not the answer."""
    monkeypatch.setenv("STUB_LABELS", "{}")
    image = "127.0.0.1:5000/t/pytorch-cpu-dev:abc-25.01"
    code, out, err = run_cli("bundle", image, str(tmp_path / "a"), "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert f"{image}: tag 'abc-25.01' names no cell of pytorch-cpu in the matrix (its versions: 2.13)" in err, err
    assert not (tmp_path / "a").exists()


# -- issue 24: a bundle is of one platform ------------------------------------------------------------------

def test_a_bundle_is_made_for_the_platform_asked_and_records_it(run_cli, tools: Path, tmp_path: Path) -> None:
    """skopeo copies the arm64 manifest of the index; the bundle's record names linux/arm64 and aarch64."""
    code, out, err = run_cli("bundle", "127.0.0.1:5000/t/other:1", str(tmp_path / "b"), "--platform", "linux/arm64",
                             "--json", "--matrix", str(REPO / "matrix.yaml"))
    assert code == 0, err
    made = json.loads(out)
    assert made["platform"] == "linux/arm64" and made["machine"] == "aarch64"
    assert tools.read_text().splitlines()[0].startswith("skopeo --override-os=linux --override-arch=arm64 copy ")
    assert json.loads((tmp_path / "b" / "dl-images-bundle.json").read_text())["machine"] == "aarch64"


def test_an_image_of_another_platform_than_asked_is_refused_and_leaves_nothing(
        run_cli, tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-platform amd64 image: skopeo copies it whatever --override-arch says; the config tells."""
    monkeypatch.setenv("STUB_ARCH", "amd64")
    code, out, err = run_cli("bundle", "127.0.0.1:5000/t/other:1", str(tmp_path / "b"), "--platform", "linux/arm64",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == ""
    assert "127.0.0.1:5000/t/other:1: the image is linux/amd64, not linux/arm64" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stub.log", "stubs"]


@pytest.mark.parametrize("declared", [{"os": "linux", "variant": "amd64"}, {"os": "linux/amd64"}])
def test_a_config_without_an_architecture_is_refused_by_name(run_cli, tools: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, declared: dict) -> None:
    """The platform check joined the config's os/architecture/variant with "/" and split it again: a config with no
    architecture whose other fields spelled linux/amd64 passed as linux/amd64."""
    monkeypatch.setenv("STUB_PLATFORM", json.dumps(declared))
    code, out, err = run_cli("bundle", "127.0.0.1:5000/t/other:1", str(tmp_path / "b"), "--platform", "linux/amd64",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == (
        f"error: 127.0.0.1:5000/t/other:1: the image's config declares no architecture ({json.dumps(declared)}), so "
        "it is of no known platform, not linux/amd64; rebuild it (`buildtool build`), or bundle an image whose config "
        "declares its os and architecture")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stub.log", "stubs"]


def test_a_bundle_of_an_image_the_matrix_does_not_know_needs_its_platform(run_cli, tools: Path,
                                                                          tmp_path: Path) -> None:
    code, out, err = run_cli("bundle", "127.0.0.1:5000/t/other:1", str(tmp_path / "b"), "--shm-size", "1g",
                             "--matrix", str(REPO / "matrix.yaml"))
    assert code == 2 and "is no image of the matrix, so its platforms are unknown: pass --platform" in err
    assert not tools.exists(), "nothing was copied"
