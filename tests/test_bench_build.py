"""bench/bench_build.py on stand-ins for `buildtool build`, the plain `docker build`, the engine and the registry:
each scenario runs --runs times and prints the medians of both arms with their ratio (the figures are scripted: no
time is measured here)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def bench_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setattr(sys, "path", list(sys.path))   # the bench puts the repository on sys.path
    from bench import bench_build as module

    monkeypatch.setattr(module.engine, "resolve_build_client", lambda: SimpleNamespace(describe=lambda: "stand-in"))
    yield module


class _Builds:
    """Scripted `buildtool build` and `docker build` runs: the seconds each returns, the arguments each got."""

    def __init__(self, fresh: list[float], warm: list[float], plain_cold: list[float], plain_warm: list[float],
                 fresh_result: str = "retagged") -> None:
        self.fresh, self.warm, self.plain_cold, self.plain_warm = fresh, warm, plain_cold, plain_warm
        self.fresh_result = fresh_result
        self.revisions: list[str] = []
        self.plain: list[tuple[str, bool]] = []

    def buildtool(self, args: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
        revision = args[args.index("--revision") + 1]
        self.revisions.append(revision)
        if revision == "bench-earlier":
            return 99.0, {"result": "built and pushed"}
        if revision == "bench-warm":
            first = self.revisions.count("bench-warm") == 1
            return (99.0, {"result": "retagged"}) if first else (self.warm.pop(0), {"result": "up to date"})
        return self.fresh.pop(0), {"result": self.fresh_result}

    def plain_docker_build(self, dockerfile: object, tag: str, no_cache: bool, **_: object) -> float:
        self.plain.append((tag, no_cache))
        return (self.plain_cold if no_cache else self.plain_warm).pop(0)


def test_each_scenario_runs_several_times_and_prints_the_medians_of_both_arms(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bench_build: ModuleType) -> None:
    """(a) and (b) ran once each: one figure per arm, no median, however noisy the machine; (a) needs a revision of
    its own each run (a revision the registry holds is 'up to date', not a fresh runner's retag)."""
    builds = _Builds(fresh=[1.0, 3.0, 2.0], warm=[0.5, 0.3, 0.4], plain_cold=[50.0, 70.0, 60.0],
                     plain_warm=[9.0, 2.0, 4.0, 3.0])   # the first plain warm build fills the cache: not timed
    monkeypatch.setattr(bench_build, "buildtool", builds.buildtool)
    monkeypatch.setattr(bench_build, "plain_docker_build", builds.plain_docker_build)
    cleaned: list[str] = []
    monkeypatch.setattr(bench_build, "cleanup", lambda namespace, tags: cleaned.append(namespace))
    monkeypatch.setattr(sys, "argv", ["bench_build.py", "--skip-cold"])
    bench_build.main()
    fresh = [r for r in builds.revisions if r.startswith("bench-fresh")]
    assert len(fresh) == 3 and len(set(fresh)) == 3
    assert builds.revisions.count("bench-warm") == 4 and [n for _, n in builds.plain].count(True) == 3
    assert not builds.fresh and not builds.warm and not builds.plain_cold and not builds.plain_warm
    lines = capsys.readouterr().out.splitlines()
    assert "medians of 3 runs, whole processes (wall seconds)" in "\n".join(lines)
    (a,) = [line for line in lines if line.startswith("(a) fresh runner")]
    (b,) = [line for line in lines if line.startswith("(b) warm no-op")]
    assert a.split()[7:10] == ["2.00s", "60.00s", "30.0x"], a
    assert "runs (s): buildtool 1.00, 3.00, 2.00; docker build 50.00, 70.00, 60.00" in a
    assert b.split()[4:7] == ["0.40s", "3.00s", "7.5x"], b
    assert len(cleaned) == 1


def test_a_build_that_does_not_retag_is_not_timed_as_a_fresh_runner(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bench_build: ModuleType) -> None:
    builds = _Builds(fresh=[1.0], warm=[], plain_cold=[], plain_warm=[9.0], fresh_result="built")
    monkeypatch.setattr(bench_build, "buildtool", builds.buildtool)
    monkeypatch.setattr(bench_build, "plain_docker_build", builds.plain_docker_build)
    cleaned: list[str] = []
    monkeypatch.setattr(bench_build, "cleanup", lambda namespace, tags: cleaned.append(namespace))
    monkeypatch.setattr(sys, "argv", ["bench_build.py", "--skip-cold", "--runs", "1"])
    with pytest.raises(SystemExit, match=r"^buildtool build -f pytorch-cpu:2.13 --revision bench-fresh-1 ended "
                                         r"'built', not 'retagged': no figure is printed$"):
        bench_build.main()
    assert len(cleaned) == 1 and "(a) fresh runner" not in capsys.readouterr().out


def test_each_cold_build_runs_several_times_and_its_earlier_images_leave_the_engine(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bench_build: ModuleType) -> None:
    """(c) built each CPU cell cold once; run again, each --force build would leave the previous image untagged."""
    monkeypatch.setattr(bench_build, "compare", lambda *args: None)
    built: list[str] = []
    untagged: list[str] = []

    def buildtool(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
        built.append(args[1])
        return (10.0, 30.0, 20.0)[built.count(args[1]) - 1], {"result": "built", "ref": f"r/{args[1]}:bench-cold"}

    def untag(ref: str) -> None:
        untagged.append(ref)

    monkeypatch.setattr(bench_build, "buildtool", buildtool)
    monkeypatch.setattr(bench_build.engine, "untag", untag)
    monkeypatch.setattr(bench_build.engine, "image_attrs", lambda ref: {"Size": 1100})
    monkeypatch.setattr(bench_build, "installed_sizes",
                        lambda ref: {"fs": 1000, "pip_cache": 0, "apt_lists": 0, "venv": 500})
    tags: list[list[str]] = []
    monkeypatch.setattr(bench_build, "cleanup", lambda namespace, local_tags: tags.append(list(local_tags)))
    monkeypatch.setattr(sys, "argv", ["bench_build.py", "--runs", "3"])
    bench_build.main()
    cells = list(dict.fromkeys(built))
    assert cells and built == [key for key in cells for _ in range(3)]
    assert untagged == [f"r/{key}:bench-cold" for key in cells for _ in range(2)]
    out = capsys.readouterr().out
    assert "(`buildtool build --force`, 3 runs; sizes of the last)" in out
    for key in cells:
        (line,) = [line for line in out.splitlines() if line.startswith(f"{key} ")]
        assert line.split()[1] == "20.0" and line.endswith("runs (s): 10.0, 30.0, 20.0"), line
    assert set(tags[0]) == {f"r/{key}:bench-cold" for key in cells}


def test_the_clean_up_reads_every_page_of_the_registry_catalogue(monkeypatch: pytest.MonkeyPatch,
                                                                 bench_build: ModuleType) -> None:
    """The clean-up read only `_catalog?n=1000`'s first page: on a registry of more repositories the bench's own, on
    a later page (the `Link` header's), kept every tag it had pushed."""
    pages = {
        "http://127.0.0.1:5000/v2/_catalog?n=1000": (["a/x", "bench-1234/plain"], "</v2/_catalog?last=b&n=1000>"),
        "http://127.0.0.1:5000/v2/_catalog?last=b&n=1000": (["bench-1234/pytorch-cpu-dev", "z/y"], ""),
    }
    deleted: list[str] = []

    class Registry(bench_build.RegistryClient):   # the real client: its pages() follows the Link headers
        def request(self, method: str, path: str, **_: object) -> object:
            if method == "DELETE":
                deleted.append(path)
                return None
            repos, link = pages[path if path.startswith("http") else self._url(path)]
            return SimpleNamespace(headers={"Link": f'{link}; rel="next"'} if link else {},
                                   json=lambda: {"repositories": repos})

        def tags(self, repo: str) -> list[str]:
            return ["t1"]

        def manifest_digest(self, repo: str, ref: str) -> str:
            return f"sha256:{repo.rpartition('/')[2]}"

    monkeypatch.setattr(bench_build, "RegistryClient", Registry)
    monkeypatch.setattr(bench_build.engine, "untag", lambda ref: None)
    monkeypatch.setattr(bench_build.engine, "sdk", lambda: SimpleNamespace(images=SimpleNamespace(list=lambda: [])))
    bench_build.cleanup("bench-1234", [])
    assert deleted == ["bench-1234/plain/manifests/sha256:plain",
                       "bench-1234/pytorch-cpu-dev/manifests/sha256:pytorch-cpu-dev"]


def test_a_failed_plain_build_never_shows_the_index_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          bench_build: ModuleType,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A failed plain `docker build` ended the bench with the last 2,000 characters of its output unmasked: pip's or
    uv's error naming the index URL showed the host's index token. Now it is masked as the builder masks its logs."""
    from tests import leaky_build

    monkeypatch.setattr("buildtool.imagebuild.pipconfig.HostPip.from_host",
                        classmethod(lambda cls, python=None: leaky_build.host()))
    monkeypatch.setattr(bench_build.engine, "resolve_build_client", lambda: leaky_build.client(tmp_path))
    monkeypatch.setattr("buildtool.imagebuild.pipconfig.answers", lambda url, cert: True)   # the index: no network
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE=debian:bookworm\nFROM ${BASE_IMAGE}\n")
    with pytest.raises(SystemExit) as caught:
        bench_build.plain_docker_build(tmp_path / "Dockerfile", "bench-x/y:1", True, base="127.0.0.1:5000/debian@sha")
    message = str(caught.value)
    assert message.startswith("docker build failed:") and "ERROR: Could not fetch https://ci:****@" in message
    assert leaky_build.TOKEN not in message
    printed = capsys.readouterr()
    assert leaky_build.TOKEN not in printed.out + printed.err


def test_a_failed_plain_build_shows_the_tail_of_what_buildkit_wrote(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                     bench_build: ModuleType) -> None:
    """`docker build --progress=plain` writes its progress and the failing step's error on stderr, nothing on stdout:
    the bench ended a failed build with the tail of stdout, an empty message. Now both streams, masked."""
    from buildtool.imagebuild.engine import BuildClient
    from tests import leaky_build

    script = tmp_path / "plain-build.py"
    script.write_text("import sys\nprint('#5 ERROR: process \"/bin/sh -c pip install torch\" did not complete "
                      f"successfully: exit code: 1 ({leaky_build.INDEX})', file=sys.stderr)\nsys.exit(1)\n")
    monkeypatch.setattr("buildtool.imagebuild.pipconfig.HostPip.from_host",
                        classmethod(lambda cls, python=None: leaky_build.host()))
    monkeypatch.setattr(bench_build.engine, "resolve_build_client",
                        lambda: BuildClient((sys.executable, str(script)), (), "buildx"))
    monkeypatch.setattr("buildtool.imagebuild.pipconfig.answers", lambda url, cert: True)   # the index: no network
    (tmp_path / "Dockerfile").write_text("ARG BASE_IMAGE=debian:bookworm\nFROM ${BASE_IMAGE}\n")
    with pytest.raises(SystemExit) as caught:
        bench_build.plain_docker_build(tmp_path / "Dockerfile", "bench-x/y:1", True, base="127.0.0.1:5000/debian@sha")
    message = str(caught.value)
    assert 'did not complete successfully: exit code: 1 (https://ci:****@' in message, message
    assert leaky_build.TOKEN not in message
