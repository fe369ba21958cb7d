"""Release gates and tag rules as pure functions: no engine, no registry."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from buildtool.common.errors import UserError
from buildtool.contracts import label_keys, skips
from buildtool.contracts.verdict import TestResult as Outcome
from buildtool.contracts.verdict import Verdict, VerdictError, parse_verdict
from buildtool.matrix.plan import Settings, plan_cell, resolve_revision
from buildtool.release.gates import Platform, check_version, image_problems, skip_allowed, verdict_problems
from buildtool.release.tag_plan import plan_tags, release_number, releases_in
from tests import signing
from tests.conftest import fixture_matrix

REPO = Path(__file__).resolve().parent.parent
CELLS = {c.key: c for c in fixture_matrix().cells}
CPU, GPU, NGC = CELLS["pytorch-cpu:2.13"], CELLS["pytorch-cuda:2.13"], CELLS["pytorch-ngc:25.10"]
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test(id_: str, group: str, result: str, reason: str = "", gpu: bool = False) -> Outcome:
    """A result entry; a skip's `reason` is the message the image test skipped with ([code] text)."""
    code, subject, text = skips.parse_skip(reason) if result == "skipped" else ("", "", "")
    if "/" not in id_:
        id_ = f"{group}/test_{id_.split('::')[0]}.py::{id_.split('::')[-1]}"
    return Outcome.model_validate({"id": id_, "group": group, "result": result, "skip_code": code,
                                      "skip_subject": subject, "skip_reason": text, "gpu": gpu})


test.__test__ = False  # a helper, not a pytest test


def verdict(cell_key: str, result: str = "passed", tests: list[Outcome] | None = None, digest: str = D1,
            **changes: object) -> Verdict:
    """A verdict covering the cell's groups: every listed test is defined, nothing deselected."""
    tests = tests if tests is not None else [test("common::a", "common", "passed"),
                                             test(f"{CELLS[cell_key].framework}::b", CELLS[cell_key].framework,
                                                  "passed")]
    body = signing.verdict(CELLS[cell_key], digest, result, tests=[t.model_dump() for t in tests], **changes)
    return parse_verdict(body, "test verdict")


# -- verdict gate --------------------------------------------------------------------------------

def test_passing_verdict_has_no_problems() -> None:
    assert verdict_problems(CPU, D1, verdict(CPU.key)) == []


def test_missing_verdict_names_the_command_to_run() -> None:
    [problem] = verdict_problems(CPU, D1, None)
    assert "no verdict" in problem and "make validate FRAMEWORK=pytorch-cpu:2.13" in problem


def test_failed_verdict_lists_failed_tests() -> None:
    tests = [test("pytorch::ddp", "pytorch", "failed"), test("common::a", "common", "passed")]
    problems = verdict_problems(CPU, D1, verdict(CPU.key, "failed", tests))
    assert any("'failed'" in p and "pytorch/test_pytorch.py::ddp" in p for p in problems)


def test_verdict_for_another_cell_refused() -> None:
    assert any("is for cell 'pytorch-cuda:2.13'" in p for p in verdict_problems(CPU, D1, verdict(GPU.key)))


def test_all_skipped_is_not_a_pass() -> None:
    tests = [test("pytorch::nccl", "pytorch", "skipped", NOT_IN_CELL)]
    assert any("no passed test" in p for p in verdict_problems(CPU, D1, verdict(CPU.key, tests=tests)))


def test_unknown_test_result_refused_where_the_verdict_is_read() -> None:
    """A result the schema does not know never reaches the gate: parsing refuses it, naming the field."""
    body = signing.verdict(CPU, D1, tests=[signing.result("common/test_x.py::test_a"),
                                           signing.result("common/test_x.py::test_b", "xfail")])
    with pytest.raises(VerdictError, match=r"`tests\[1\]\.result`: input should be 'passed', 'failed' or 'skipped'"):
        parse_verdict(body, "x")


NO_GPU = "[no-gpu-on-runner] no GPU on this runner"
NOT_IN_CELL = "[gpu-not-in-cell] the cell's run profile has no GPUs"


@pytest.mark.parametrize(("cell", "t", "allowed"), [
    (CPU, test("pytorch::nccl", "pytorch", "skipped", NOT_IN_CELL, gpu=True), True),
    (CPU, test("pytorch::gloo", "pytorch", "skipped", NOT_IN_CELL), False),   # a code only GPU tests may carry
    (CPU, test("pytorch::nccl", "pytorch", "skipped", "flaky, skipped for now"), False),     # no code: refused
    (CPU, test("pytorch::nccl", "pytorch", "skipped", ""), False),
    (CPU, test("pytorch::nccl", "pytorch", "skipped", "[no-such-code] anything"), False),     # unknown code
    (CPU, test("pytorch::nccl", "pytorch", "skipped", NO_GPU), False),       # a runner's state, not the matrix's
    (GPU, test("pytorch::nccl", "pytorch", "skipped", NOT_IN_CELL, gpu=True), False),  # the matrix gives it GPUs
    (GPU, test("pytorch::nccl", "pytorch", "skipped", NO_GPU, gpu=True), False),       # GPU cell: must run
    (NGC, test("pytorch::nccl", "pytorch", "skipped", NO_GPU, gpu=True), False),
    (CPU, test("tensorflow::x", "tensorflow", "skipped", "not this framework"), False),  # prose never counts
    # reasons the release checks against the matrix again
    # a code no image test emits is no code (test_skip_codes keeps the list and the tests in step)
    (CPU, test("common::ulimit[nofile]", "common", "skipped", "[ulimit-not-in-profile:nofile] not set"), False),
    (CPU, test("common::pkgs", "common", "skipped", "[no-pinned-packages] none"), False),  # it pins some
    (GPU, test("common::ulimit[memlock]", "common", "skipped",
               "[ulimit-not-granted:memlock] this runner's Docker engine cannot grant --ulimit memlock=-1"),
     False),                                                                                # runner, not matrix
    (CPU, test("common::cross", "common", "skipped", "[no-peer-image] no tensorflow image"), False),
])
def test_skip_rule(cell, t, allowed) -> None:  # noqa: ANN001
    assert skip_allowed(cell, t) is allowed


def test_bad_skips_are_named() -> None:
    tests = [test("common::a", "common", "passed"),
             *(test(f"pytorch::g{i}", "pytorch", "skipped", f"{NO_GPU} here", gpu=True) for i in range(5))]
    found = verdict_problems(GPU, D1, verdict(GPU.key, tests=tests))
    [problem] = [p for p in found if "skipped where the matrix expects them to run" in p]
    assert any("5 GPU test(s) of GPU cell" in p for p in found)
    assert "5 test(s) skipped" in problem and "pytorch/test_pytorch.py::g0 (no GPU on this runner here)" in problem
    assert "2 more" in problem


# -- image gate: provenance ----------------------------------------------------------------------

NGC_BASE = {label_keys.CELL: NGC.key, label_keys.OCI_BASE_NAME: NGC.base}
CPU_BASE = {label_keys.CELL: CPU.key, label_keys.OCI_BASE_NAME: CPU.base}


def test_standin_refused_on_any_platform() -> None:
    good = Platform("linux/amd64", D1, 1, NGC_BASE)
    bad = Platform("linux/arm64", D2, 1, {**NGC_BASE, label_keys.STANDIN: "true"})
    assert image_problems(NGC, [good]) == []
    [problem] = image_problems(NGC, [good, bad])
    assert "stand-in" in problem and D2 in problem and "linux/arm64" in problem


@pytest.mark.parametrize("labels", [
    {label_keys.STANDIN: "false", label_keys.STANDIN_FOR: "nvcr.io/nvidia/pytorch:25.10-py3"},  # relabelled
    {label_keys.STANDIN_FRAMEWORK: "2.13.0+cpu"},            # only one of the others left
    {f"{label_keys.STANDIN_PREFIX}-note": "x"},                           # any key starting so
])
def test_any_standin_label_refuses_whatever_its_value(labels: dict) -> None:
    [problem] = image_problems(NGC, [Platform("", D1, 1, {**NGC_BASE, **labels})])
    assert "stand-in labels" in problem and next(iter(labels)) in problem


def test_base_digest_or_layers_of_a_mirror_standin_refuse_without_any_label() -> None:
    from buildtool.release.gates import StandIns

    standins = StandIns()
    standins.add("127.0.0.1:5000/nvidia/pytorch:25.10-py3", D2, ["sha256:aa", "sha256:bb"])
    by_digest = Platform("", D1, 1, {**NGC_BASE, label_keys.OCI_BASE_DIGEST: D2})
    [problem] = image_problems(NGC, [by_digest], standins)
    assert "built on" in problem and "stand-in 127.0.0.1:5000/nvidia/pytorch:25.10-py3" in problem
    # Labels rewritten to claim another base: the layers still start with the stand-in's.
    by_layers = Platform("", D1, 1, {**NGC_BASE, label_keys.OCI_BASE_DIGEST: "sha256:" + "9" * 64},
                         layers=("sha256:aa", "sha256:bb", "sha256:cc"))
    [problem] = image_problems(NGC, [by_layers], standins)
    assert "starts with the layers of the stand-in" in problem
    not_on_it = Platform("", D1, 1, NGC_BASE, layers=("sha256:aa", "sha256:cc"))
    assert image_problems(NGC, [not_on_it], standins) == []


def test_a_base_labelled_standin_refuses() -> None:
    on_standin = Platform("", D1, 1, {**NGC_BASE, label_keys.OCI_BASE_DIGEST: D2},
                          base_labels={label_keys.STANDIN: "true"})
    [problem] = image_problems(NGC, [on_standin])
    assert "labelled a stand-in" in problem
    assert image_problems(NGC, [Platform("", D1, 1, NGC_BASE, base_labels={"x": "y"})]) == []


@pytest.mark.parametrize("base", [None, "docker.io/library/debian:bookworm-slim", "127.0.0.1:5000/nvidia/pytorch:x"])
def test_base_name_must_be_the_matrix_upstream(base: str | None) -> None:
    labels = {k: v for k, v in NGC_BASE.items() if k != label_keys.OCI_BASE_NAME}
    if base is not None:
        labels[label_keys.OCI_BASE_NAME] = base
    [problem] = image_problems(NGC, [Platform("", D1, 1, labels)])
    assert f"not the matrix's {NGC.base}" in problem and str(base or "(none)") in problem


@pytest.mark.parametrize("name", ["127.0.0.1:5000/library/debian:bookworm-slim",   # the local mirror
                                  "mirror.example/team/library/debian:bookworm-slim",  # a mirror with a prefix
                                  "docker.io/library/debian:bookworm-slim"])        # no mirror
def test_an_image_built_from_a_mirror_of_the_matrix_base_passes(name: str) -> None:
    labels = {label_keys.CELL: CPU.key, label_keys.BASE_UPSTREAM: CPU.base, label_keys.OCI_BASE_NAME: name}
    assert image_problems(CPU, [Platform("", D1, 1, labels)]) == []


@pytest.mark.parametrize(("labels", "message"), [
    ({label_keys.BASE_UPSTREAM: "docker.io/library/debian:trixie-slim",
      label_keys.OCI_BASE_NAME: "127.0.0.1:5000/library/debian:trixie-slim"},
     f"names base docker.io/library/debian:trixie-slim ({label_keys.BASE_UPSTREAM}), not the matrix's"),
    ({label_keys.BASE_UPSTREAM: "docker.io/library/debian:bookworm-slim",
      label_keys.OCI_BASE_NAME: "127.0.0.1:5000/library/ubuntu:bookworm-slim"},
     f"was built from 127.0.0.1:5000/library/ubuntu:bookworm-slim ({label_keys.OCI_BASE_NAME}), which is neither"),
    ({label_keys.BASE_UPSTREAM: "docker.io/library/debian:bookworm-slim",
      label_keys.OCI_BASE_NAME: "127.0.0.1:5000/library/debian:trixie-slim"}, "nor a mirror of it"),
    ({label_keys.BASE_UPSTREAM: "docker.io/library/debian:bookworm-slim"}, "was built from (none)"),
])
def test_a_base_name_that_is_not_the_upstream_or_its_mirror_refuses(labels: dict[str, str], message: str) -> None:
    [problem] = image_problems(CPU, [Platform("", D1, 1, {label_keys.CELL: CPU.key, **labels})])
    assert message in problem, problem


def test_cell_label_must_match() -> None:
    [problem] = image_problems(CPU, [Platform("", D1, 1, {**CPU_BASE, label_keys.CELL: "tensorflow-cpu:2.21"})])
    assert "not pytorch-cpu:2.13" in problem


# -- tags ----------------------------------------------------------------------------------------

def plan_for(version: str):  # noqa: ANN201
    return plan_cell(CPU, Settings(), "abcdef123456", version)


def test_release_number_parses_only_this_cells_tags() -> None:
    assert str(release_number("2.13-0.1.0", "{version}-{release}", CPU)) == "0.1.0"
    assert release_number("2.12-0.1.0", "{version}-{release}", CPU) is None
    assert release_number("latest", "{version}-{release}", CPU) is None
    assert sorted(str(v) for v in releases_in(["2.13-0.1.0", "2.13-0.10.0", "2.13", "x"], CPU)) == ["0.1.0", "0.10.0"]


def test_fresh_release_creates_every_tag() -> None:
    actions, problems = plan_tags(plan_for("0.1.0"), D1, "0.1.0", {}, [], force=False)
    assert problems == [] and [(a.tag, a.action) for a in actions] == [
        ("2.13-0.1.0", "create"), ("2.13", "create"), ("latest", "create")]


def test_rerun_is_all_exists() -> None:
    current = {"2.13-0.1.0": D1, "2.13": D1, "latest": D1}
    actions, problems = plan_tags(plan_for("0.1.0"), D1, "0.1.0", current, list(current), force=False)
    assert problems == [] and {a.action for a in actions} == {"exists"}


@pytest.mark.parametrize("force", [False, True])
def test_version_tag_on_other_digest_refused_even_forced(force: bool) -> None:
    current = {"2.13-0.1.0": D2}
    _, problems = plan_tags(plan_for("0.1.0"), D1, "0.1.0", current, list(current), force=force)
    assert len(problems) == 1 and "immutable" in problems[0] and D2 in problems[0]


def test_moving_tags_move_forward_freely_and_back_only_with_force() -> None:
    current = {"2.13": D2, "latest": D2}
    tags = ["2.13-0.2.0", "2.13", "latest"]
    forward, _ = plan_tags(plan_for("0.3.0"), D1, "0.3.0", current, tags, force=False)
    assert [a.action for a in forward if a.moving] == ["move", "move"]
    back, problems = plan_tags(plan_for("0.1.1"), D1, "0.1.1", current, tags, force=False)
    assert problems == [] and [a.action for a in back if a.moving] == ["keep", "keep"]
    assert "0.2.0" in back[1].note
    forced, _ = plan_tags(plan_for("0.1.1"), D1, "0.1.1", current, tags, force=True)
    assert [a.action for a in forced if a.moving] == ["move", "move"]


# -- inputs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["", "latest", "0.1.0/x", "{release}", "1.0 beta"])
def test_bad_versions_refused(bad: str) -> None:
    with pytest.raises(UserError, match="--version"):
        check_version(bad)


def test_good_versions() -> None:
    for good in ("0.1.0", "1.2.3rc1", "2026.1"):
        assert check_version(good) == good


def test_resolve_revision(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=t@e", "-c", "user.name=t", *args],
                              check=True, capture_output=True, text=True, timeout=30).stdout.strip()

    git("init", "-q")
    (tmp_path / "f").write_text("x")
    git("add", "f")
    git("commit", "-qm", "x")
    full = git("rev-parse", "HEAD")
    short = git("rev-parse", "--short=12", "HEAD")
    assert resolve_revision(tmp_path, None, lambda root: "from-head") == "from-head"
    assert resolve_revision(tmp_path, full, lambda root: "unused") == short
    assert resolve_revision(tmp_path, full[:8].upper(), lambda root: "unused") == short
    assert resolve_revision(tmp_path, f"{short}-dirty.0a1b2c3d", lambda root: "x") == f"{short}-dirty.0a1b2c3d"
    assert resolve_revision(tmp_path, "ab" * 20, lambda root: "x") == ("ab" * 20)[:12]   # not in this clone
    # A branch of the clone names its commit; a revision a pipeline named itself is used as it is
    # (build --revision X, then validate --revision X).
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    assert resolve_revision(tmp_path, branch, lambda root: "x") == short
    assert resolve_revision(tmp_path, "nightly-42", lambda root: "x") == "nightly-42"
    for bad in ("a/b", "-x", "x y", "v:1"):
        with pytest.raises(UserError, match="--from"):
            resolve_revision(tmp_path, bad, lambda root: "x", option="--from")


# -- lock staleness ------------------------------------------------------------------------------

def test_lock_staleness_rules() -> None:
    import os
    import socket
    import time

    from buildtool.release.repo_lock import _ACTIVE_TOKENS, RepoLock

    lock = RepoLock(None, "repo")  # type: ignore[arg-type]  # _free reads no registry
    me, later = socket.gethostname(), f"{time.time() + 60:.3f}"

    def info(**kw: str) -> dict[str, str]:
        base = {"host": "elsewhere", "pid": "1", "token": "t", "expires": later, "released": "false"}
        base.update(kw)
        keys = {"host": label_keys.LOCK_HOST, "pid": label_keys.LOCK_PID, "token": label_keys.LOCK_TOKEN,
                "expires": label_keys.LOCK_EXPIRES, "released": label_keys.LOCK_RELEASED}
        return {keys[k]: v for k, v in base.items()}

    assert lock._free(info(released="true"))
    assert lock._free(info(expires=f"{time.time() - 1:.3f}"))
    assert not lock._free(info())                                   # another machine, not expired: busy
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    assert lock._free(info(host=me, pid=str(dead.pid)))             # holder on this host has ended
    assert not lock._free(info(host=me, pid=str(os.getppid())))     # holder on this host still running
    assert lock._free(info(host=me, pid=str(os.getpid()), token="gone"))   # an earlier call of this process
    _ACTIVE_TOKENS.add("held")
    try:
        assert not lock._free(info(host=me, pid=str(os.getpid()), token="held"))
    finally:
        _ACTIVE_TOKENS.discard("held")


def test_package_skip_allowed_only_when_the_matrix_pins_none() -> None:
    import dataclasses

    bare = dataclasses.replace(CPU, packages=())
    t = test("common/test_contents.py::test_extra_packages", "common", "skipped",
             "[no-pinned-packages] the cell pins no extra packages")
    assert skip_allowed(bare, t) and not skip_allowed(CPU, t)


def test_waivers_are_explicit_and_never_cover_gpu_tests_of_gpu_cells() -> None:
    runner = test("common/test_run_profile.py::test_ulimit[memlock]", "common", "skipped",
                  "[ulimit-not-granted:memlock] this runner's Docker engine cannot grant --ulimit memlock=-1 (it "
                  "refused ...)")
    gpu = test("pytorch::nccl", "pytorch", "skipped", f"{NO_GPU} (nvidia-smi found none)", gpu=True)
    ok = test("common::a", "common", "passed")
    skipped = "1 test(s) skipped where the matrix expects them to run: common/test_run_profile.py::test_ulimit[memlock]"
    refused = verdict_problems(CPU, D1, verdict(CPU.key, tests=[ok, runner]))                  # refused by default
    assert len(refused) == 1 and refused[0].startswith(skipped), refused
    assert verdict_problems(CPU, D1, verdict(CPU.key, tests=[ok, runner]), ("ulimit-not-granted:memlock",)) == []
    other = verdict_problems(CPU, D1, verdict(CPU.key, tests=[ok, runner]), ("ulimit-not-granted:stack",))
    assert len(other) == 1 and other[0].startswith(skipped), other  # a waiver for another limit covers nothing
    # no waiver for this, whatever is passed (a waiver names a waivable code, issue 48)
    gpu_cell = verdict_problems(GPU, D1, verdict(GPU.key, tests=[ok, gpu]), ("no-gpu-on-runner", "ulimit-not-granted"))
    assert any(p.startswith("1 GPU test(s) of GPU cell pytorch-cuda:2.13 did not pass: pytorch/test_pytorch.py::nccl")
               and "no waiver covers them" in p for p in gpu_cell), gpu_cell


def test_standins_are_read_from_the_mirror_only() -> None:
    """BASE_MIRROR in upstream=mirror form maps only some hosts: an unmapped base is the upstream
    itself, not a mirror's stand-in, and is not read (nvcr.io cannot be reached)."""
    from buildtool.release.read import read_standins

    class Reads:
        host = "127.0.0.1:5000"
        asked: list[str] = []

        def get_manifest(self, repo: str, ref: str):  # noqa: ANN201
            self.asked.append(f"{repo}:{ref}")
            from buildtool.registry.client import NotFound

            raise NotFound(repo)

    client = Reads()
    found, problems = read_standins(client, Settings(base_mirror="docker.io=127.0.0.1:5000/hub"),  # type: ignore[arg-type]
                                    [NGC])
    assert problems == [] and client.asked == [] and found.digests == {}
    read_standins(client, Settings(base_mirror="127.0.0.1:5000"), [NGC])  # type: ignore[arg-type]
    assert client.asked == ["nvidia/pytorch:25.10-py3"]
