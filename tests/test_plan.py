"""Naming, tagging and the plan JSON that CI matrices consume."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.common.refs import split_reference
from buildtool.contracts import names
from buildtool.matrix.plan import Settings, content_key, full_revision, git_full_revision, git_revision, mirror_base


def test_plan_json_has_one_include_entry_per_cell(project: Path, run_cli, monkeypatch):
    monkeypatch.delenv("REGISTRY", raising=False)
    monkeypatch.delenv("BASE_MIRROR", raising=False)
    code, out, _ = run_cli("plan", "--json", "--matrix", str(project / "matrix.yaml"))
    assert code == 0
    include = json.loads(out)["include"]
    assert [e["cell"] for e in include] == ["pytorch-ngc:25.10", "pytorch-ngc:25.01", "tensorflow-ngc:25.02",
                                             "tensorflow-ngc:25.01", "pytorch-cpu:2.13", "pytorch-cuda:2.13",
                                             "tensorflow-cpu:2.21"]
    sha = subprocess.run(["git", "-C", str(project), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()
    cpu = include[4]
    assert set(cpu) >= {"cell", "image", "version", "dev_image", "release_repo", "release_tags", "moving_tags",
                        "base", "upstream_base", "build_args", "tests", "run", "needs_gpu", "dockerfile", "use"}
    assert cpu["dev_image"] == f"{names.dev_repo(names.DEFAULT_REGISTRY, 'pytorch-cpu')}:{names.dev_tag(sha, '2.13')}"
    assert cpu["release_repo"] == "127.0.0.1:5000/pytorch-cpu"
    assert cpu["release_tags"] == ["2.13-{release}"] and cpu["moving_tags"] == ["2.13", "latest"]
    assert cpu["build_args"] == {"BASE_IMAGE": "docker.io/library/debian:bookworm-slim"}
    assert cpu["tests"] == ["common", "pytorch"] and cpu["needs_gpu"] is False
    assert cpu["run"]["docker_flags"] == ["--shm-size=8g", "--ulimit=stack=67108864"]
    assert include[0]["run"]["gpus"] == "all" and include[0]["needs_gpu"] is True
    assert include[1]["moving_tags"] == ["25.01"]


def test_plan_honours_registry_mirror_release_and_framework(project: Path, run_cli, monkeypatch):
    monkeypatch.setenv("REGISTRY", "registry.example.org/ml")
    monkeypatch.setenv("BASE_MIRROR", "127.0.0.1:5000")
    code, out, _ = run_cli("plan", "--json", "-f", "tensorflow", "--release", "0.3.0",
                           "--matrix", str(project / "matrix.yaml"))
    assert code == 0
    include = json.loads(out)["include"]
    assert {e["image"] for e in include} == {"tensorflow-ngc", "tensorflow-cpu"}
    ngc = include[0]
    assert ngc["dev_repo"] == "registry.example.org/ml/tensorflow-ngc-dev"
    assert ngc["base"] == "127.0.0.1:5000/nvidia/tensorflow:25.02-tf2-py3"
    assert ngc["upstream_base"] == "nvcr.io/nvidia/tensorflow:25.02-tf2-py3"
    assert ngc["release_tags"] == ["25.02-0.3.0"]


@pytest.mark.parametrize("base_mirror", ["127.0.0.1:5000/", "nvcr.io=127.0.0.1:5000/"])
def test_a_base_mirror_with_a_trailing_slash_is_taken_as_registry_is(project: Path, run_cli, monkeypatch,
                                                                     base_mirror: str):
    """REGISTRY='host/' works; BASE_MIRROR='host/' (alone or as a pair's mirror) is the same registry."""
    monkeypatch.setenv("BASE_MIRROR", base_mirror)
    Settings.from_env()   # not refused
    assert mirror_base("nvcr.io/nvidia/pytorch:25.10-py3", base_mirror) == "127.0.0.1:5000/nvidia/pytorch:25.10-py3"
    code, out, err = run_cli("plan", "--json", "-f", "pytorch-ngc:25.10", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    assert json.loads(out)["include"][0]["base"] == "127.0.0.1:5000/nvidia/pytorch:25.10-py3"


def test_plan_table_for_people(project: Path, run_cli):
    code, out, _ = run_cli("plan", "-f", "pytorch-cpu:2.13", "--matrix", str(project / "matrix.yaml"))
    assert code == 0 and "pytorch-cpu:2.13" in out and "pytorch-cpu-dev:" in out


def test_dirty_tree_gets_a_distinct_revision(project: Path):
    clean = git_revision(project)
    assert re.fullmatch(r"[0-9a-f]{12}", clean)
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text() + "\n# edit\n")
    dirty = git_revision(project)
    assert dirty.startswith(f"{clean}-dirty.") and dirty != clean
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text() + "# another edit\n")
    assert git_revision(project) not in (clean, dirty)


def _scratch_repo(root: Path) -> Path:
    root.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@example.org"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    (root / "tracked.bin").write_bytes(b"\0\1\2")
    subprocess.run(["git", "-C", str(root), "add", "."], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", "one"], check=True, capture_output=True)
    return root


@pytest.mark.parametrize("path", ["newdir/f", "new dir/f", "with space", "caf\u00e9", "docs/releases/sub/f"])
def test_every_untracked_file_counts_in_the_dirty_revision(tmp_path: Path, path: str):
    """git status lists a new folder as `newdir/` and quotes a name with a space: each untracked file's contents
    must still count, so two different dirty trees never share a dev tag (REVISION_PATHSPEC excepted)."""
    repo = _scratch_repo(tmp_path / "repo")
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("a\n")
    first = git_revision(repo)
    (repo / path).write_text("b\n")
    if path.startswith("docs/releases/"):   # what release writes never makes the tree dirty
        assert git_revision(repo) == first and "-dirty." not in first
    else:
        assert "-dirty." in first and git_revision(repo) != first


def _head(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_full_revision_is_the_whole_commit_with_the_same_dirty_hash(project: Path):
    head = _head(project)
    assert git_full_revision(project) == head and len(head) == 40
    assert full_revision(project, git_revision(project)) == head
    assert full_revision(project, "nightly-42") == head          # a pipeline's name labels the work tree's commit
    (project / "matrix.yaml").write_text((project / "matrix.yaml").read_text() + "\n# edit\n")
    short = git_revision(project)
    dirty = short.partition("-dirty.")[2]
    assert git_full_revision(project) == f"{head}-dirty.{dirty}"
    assert full_revision(project, short) == f"{head}-dirty.{dirty}"


def test_a_revision_no_commit_of_the_clone_cannot_be_labelled(project: Path):
    with pytest.raises(UserError, match=r"revision '0123456789ab' is not a commit of .*: the image's revision "
                                        r"label must name the whole commit"):
        full_revision(project, "0123456789ab")


def test_revision_outside_git_is_a_clear_error(tmp_path: Path):
    with pytest.raises(UserError, match="git"):
        git_revision(tmp_path)


@pytest.mark.parametrize(("base", "mirror", "expected"), [
    ("nvcr.io/nvidia/pytorch:25.10-py3", "", "nvcr.io/nvidia/pytorch:25.10-py3"),
    ("nvcr.io/nvidia/pytorch:25.10-py3", "127.0.0.1:5000", "127.0.0.1:5000/nvidia/pytorch:25.10-py3"),
    ("docker.io/library/debian:bookworm-slim", "127.0.0.1:5000", "127.0.0.1:5000/library/debian:bookworm-slim"),
    ("debian:bookworm-slim", "mirror.example/hub", "mirror.example/hub/library/debian:bookworm-slim"),
    ("nvcr.io/nvidia/pytorch:25.10-py3", "docker.io=hub.local/proxy", "nvcr.io/nvidia/pytorch:25.10-py3"),
    ("nvcr.io/nvidia/pytorch:25.10-py3", "docker.io=hub.local,nvcr.io=ngc.local/cache",
     "ngc.local/cache/nvidia/pytorch:25.10-py3"),
])
def test_base_mirror(base: str, mirror: str, expected: str):
    assert mirror_base(base, mirror) == expected


def test_bad_base_mirror_is_a_user_error():
    with pytest.raises(UserError, match="BASE_MIRROR"):
        mirror_base("nvcr.io/nvidia/pytorch:25.10-py3", "nvcr.io=")


def test_split_reference():
    assert split_reference("localhost:5000/a/b:1") == ("localhost:5000", "a/b", "1")
    assert split_reference("ubuntu") == ("docker.io", "library/ubuntu", "latest")


def test_settings_from_env():
    settings = Settings.from_env({"REGISTRY": "r.example/ml/", "BASE_MIRROR": " m.example "})
    assert settings == Settings(registry="r.example/ml", release_registry="r.example/ml", base_mirror="m.example")


@pytest.mark.parametrize(("env", "fragment"), [
    ({"REGISTRY": "bad host"}, "REGISTRY='bad host' is not a registry"),
    ({"REGISTRY": "myregistry"}, "REGISTRY='myregistry' is not a registry"),
    ({"RELEASE_REGISTRY": "r.example/a:b"}, "RELEASE_REGISTRY='r.example/a:b' is not a registry"),
    ({"BASE_MIRROR": "m"}, "BASE_MIRROR='m' is not a registry"),
    ({"BASE_MIRROR": "nvcr.io="}, "BASE_MIRROR item 'nvcr.io=' is not `upstream-host=mirror`"),
    ({"BASE_MIRROR": "nvcr.io=mirror.example/ngc,$(id)=x.example"}, "BASE_MIRROR upstream='$(id)' is not a registry"),
])
def test_registry_settings_are_checked(env: dict[str, str], fragment: str):
    """REGISTRY, RELEASE_REGISTRY and BASE_MIRROR end up in image references: refused at once."""
    with pytest.raises(UserError, match=re.escape(fragment)):
        Settings.from_env(env)


def test_content_key_changes_with_each_input():
    base = content_key(b"FROM x\n", "sha256:aa", {"client": "docker"})
    assert base == content_key(b"FROM x\n", "sha256:aa", {"client": "docker"})
    assert len({base, content_key(b"FROM y\n", "sha256:aa", {"client": "docker"}),
                content_key(b"FROM x\n", "sha256:bb", {"client": "docker"}),
                content_key(b"FROM x\n", "sha256:aa", {"client": "buildx"}),
                content_key(b"FROM x\n", "sha256:aa", {"client": "docker"}, {"f": b"1"})}) == 5


@pytest.mark.parametrize(("value", "fragment"), [
    # A list of plain registries passed the settings check item by item, then became the base reference
    # "127.0.0.1:5000,127.0.0.1:5001/library/python:...".
    ("127.0.0.1:5000,127.0.0.1:5001", "BASE_MIRROR='127.0.0.1:5000,127.0.0.1:5001' names 2 registries"),
    # The same upstream twice: which mirror served it depended on the order of the pairs.
    ("docker.io=a.example,docker.io=b.example", "BASE_MIRROR names docker.io twice"),
    ("127.0.0.1:5000,nvcr.io=ngc.local", "BASE_MIRROR item '127.0.0.1:5000' is not `upstream-host=mirror`"),
])
def test_settings_and_mirror_base_refuse_the_same_base_mirror(value: str, fragment: str):
    """Settings.from_env and mirror_base read BASE_MIRROR one way: what the first accepts, the second maps."""
    with pytest.raises(UserError, match=re.escape(fragment)):
        Settings.from_env({"BASE_MIRROR": value})
    with pytest.raises(UserError, match=re.escape(fragment)):
        mirror_base("python:3.12-slim-bookworm", value)


def test_an_empty_item_of_base_mirror_is_ignored_by_every_reader():
    """`docker.io=m.example,` (a trailing comma): the settings check ignored the empty item, mirror_base refused it."""
    settings = Settings.from_env({"BASE_MIRROR": "docker.io=m.example,"})
    mapped = mirror_base("python:3.12-slim-bookworm", settings.base_mirror)
    assert mapped == "m.example/library/python:3.12-slim-bookworm"


@pytest.mark.parametrize(("given", "normal"), [("v0.3.0", "0.3.0"), ("0.3.0-RC1", "0.3.0rc1")])
def test_plan_release_is_the_release_release_makes(project: Path, run_cli, given: str, normal: str) -> None:
    """`plan --release` (the release workflow's version check, uploaded as the release's plan) reads the version as
    `buildtool release --version` does: its tags are the ones release makes, in PEP 440's normal form."""
    code, out, err = run_cli("plan", "--json", "-f", "tensorflow-cpu", "--release", given, "--revision",
                             "0123456789ab", "--matrix", str(project / "matrix.yaml"))
    assert code == 0, err
    assert json.loads(out)["include"][0]["release_tags"] == [f"2.21-{normal}"]
    assert f"note: --release {given} is release {normal}" in err


def test_plan_release_that_is_no_version_is_refused_as_release_refuses_it(project: Path, run_cli) -> None:
    code, out, err = run_cli("plan", "--json", "--release", "latest", "--revision", "0123456789ab",
                             "--matrix", str(project / "matrix.yaml"))
    assert code == 2 and out == "", err
    assert err.strip() == ("error: --release 'latest' is not a version like 0.1.0 (what `buildtool release --version` "
                           "takes)")
