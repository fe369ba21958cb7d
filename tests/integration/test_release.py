"""Release against the real local registry: digests kept, gates refuse, faults survived or reported.

Images are real, pullable OCI images written straight into the registry (a gzip tar layer,
a config with the labels `buildtool build` sets), single-arch and a two-platform index,
under a unique `t-release-<random>/` prefix; verdicts are signed with a test key and attached
as validate attaches them (tests/signing.py).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import shutil
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from buildtool.attest.referrers import referrers
from buildtool.contracts import label_keys, names
from buildtool.contracts.names import ATTESTATION_TYPE
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.plan import Settings
from buildtool.matrix.schema import Cell
from buildtool.registry.client import OCI_INDEX, OCI_MANIFEST, RegistryClient, RetryPolicy, sha256_digest
from buildtool.release.promote import LOCK_TAG, ReleaseOptions, release
from tests import signing
from tests.faultproxy import FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.engine, pytest.mark.registry]

REPO = Path(__file__).resolve().parents[2]
HOST = os.environ.get("REGISTRY_HOST", "127.0.0.1:5000")
MATRIX = load_matrix(REPO / "matrix.yaml", REPO / "templates")
CELLS = {c.key: c for c in MATRIX.cells}
CPU, TF_CPU, GPU, NGC = (CELLS["pytorch-cpu:2.13"], CELLS["tensorflow-cpu:2.21"], CELLS["pytorch-cuda:2.13"],
                         CELLS["pytorch-ngc:25.10"])
FAST = RetryPolicy(attempts=4, first_delay=0.05, max_delay=0.2, timeout=2.0)


# -- building real images in the registry ------------------------------------------------------

def layer(payload: bytes, name: str = "payload.bin") -> tuple[bytes, str]:
    """A gzip tar layer holding one file; returns (compressed bytes, diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    uncompressed = raw.getvalue()
    return gzip.compress(uncompressed, mtime=0), sha256_digest(uncompressed)


def push_single(client: RegistryClient, repo: str, tag: str | None, labels: dict[str, str],
                payload_size: int = 64 * 1024, arch: str = "amd64") -> tuple[str, int]:
    """Push a one-layer image; returns (manifest digest, layer size). Random payload: incompressible."""
    blob, diff_id = layer(os.urandom(payload_size))
    config = json.dumps({"architecture": arch, "os": "linux", "config": {"Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": client.put_blob(repo, config), "size": len(config)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": client.put_blob(repo, blob), "size": len(blob)}]}
    raw = json.dumps(manifest).encode()
    digest = client.put_manifest(repo, tag or sha256_digest(raw), raw, OCI_MANIFEST)
    return digest, len(blob)


def push_index(client: RegistryClient, repo: str, tag: str, labels: dict[str, str]) -> tuple[str, list[str]]:
    children = []
    for arch in ("amd64", "arm64"):
        digest, _ = push_single(client, repo, None, labels, 4096, arch)
        raw, _, _ = client.get_manifest(repo, digest)
        children.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                         "platform": {"os": "linux", "architecture": arch}})
    raw = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": children}).encode()
    return client.put_manifest(repo, tag, raw, OCI_INDEX), [c["digest"] for c in children]


def labels_for(cell: Cell, **extra: str) -> dict[str, str]:
    return {label_keys.CELL: cell.key, label_keys.FRAMEWORK: cell.framework,
            label_keys.FRAMEWORK_VERSION: cell.framework_version, label_keys.PYTHON: cell.python,
            label_keys.OCI_BASE_NAME: cell.base, label_keys.OCI_BASE_DIGEST: signing.BASE_DIGEST, **extra}


def verdict(cell: Cell, digest: str, result: str = "passed", tests: list[dict] | None = None,
            **changes: object) -> dict:
    return signing.verdict(cell, digest, result, tests=tests, **changes)


def store_verdict(client: RegistryClient, repo: str, digest: str, body: dict) -> None:
    signing.attest(client, repo, digest, body)


class Space:
    """A unique registry prefix: dev images under <prefix>/, releases under <prefix>/rel/."""

    def __init__(self, project: Path | None = None) -> None:
        self.project = project    # the git clone release runs in: the provenance names its commits
        self.prefix = f"t-release-{uuid.uuid4().hex[:10]}"
        self.client = RegistryClient(HOST, retry=FAST)
        self.settings = Settings(registry=f"{HOST}/{self.prefix}", release_registry=f"{HOST}/{self.prefix}/rel")

    def dev_repo(self, cell: Cell) -> str:
        return names.dev_repo(self.prefix, cell.name)

    def rel_repo(self, cell: Cell) -> str:
        return f"{self.prefix}/rel/{cell.name}"

    def build(self, cell: Cell, revision: str, *, result: str | None = "passed", tests: list[dict] | None = None,
              payload_size: int = 64 * 1024, verdict_changes: dict | None = None, provenance: bool = True,
              **extra_labels: str) -> str:
        """A dev image of `cell` at `revision` with its SBOM (plain and signed, as push attaches them), the
        signed provenance a push attaches unless `provenance` is false, and a stored verdict (naming that SBOM)
        unless result is None."""
        repo = self.dev_repo(cell)
        digest, _ = push_single(self.client, repo, names.dev_tag(revision, cell.version),
                                labels_for(cell, **extra_labels), payload_size)
        signing.attest_sbom(self.client, repo, digest)
        if provenance:
            # The commit the dev tag names, in full (in this checkout without a project: rev()).
            commit = git(self.project, "rev-parse", revision) if self.project is not None else commit_of(revision)
            signing.attach_provenance(self.client, repo, digest, signing.provenance(cell, revision=commit,
                                                                                    root=self.project))
        if result is not None:
            # A verdict validated in the project read its committed matrix (what release compares it with).
            bound = {"matrix_digest": signing.committed_matrix(self.project)} if self.project is not None else {}
            store_verdict(self.client, repo, digest, verdict(cell, digest, result, tests,
                                                             **{**bound, **(verdict_changes or {})}))
        return digest

    def resolve(self, cell: Cell, tag: str) -> str | None:
        return self.client.manifest_digest(self.rel_repo(cell), tag)

    def release(self, cells: list[Cell], revision: str, version: str, client: RegistryClient | None = None,
                **kw: object):
        kw = {"lock_wait_s": 20.0, "trusted": signing.trusted(), "known_code": signing.known_code(),
              "source_check": signing.source_check(), **kw}
        options = ReleaseOptions(version=version, revision=revision, **kw)  # type: ignore[arg-type]
        return release(cells, self.settings, options, client_for=lambda host: client or self.client)


@pytest.fixture
def space() -> Iterator[Space]:
    yield Space()


_COMMITS: list[str] = []
CHECKOUT = Path(__file__).resolve().parents[2]


def commit_of(revision: str) -> str:
    """The commit `revision` (rev()'s) names in this checkout, in full: what an image's provenance names."""
    return git(CHECKOUT, "rev-parse", revision)


def rev() -> str:
    """A commit of this checkout, 12 digits: HEAD or one of its last ancestors, a different one from the call before
    (a test's images at distinct revisions). Release checks that an image's signed provenance names its dev tag's
    revision, and that it is the release commit or its ancestor, so a made-up revision is never released."""
    if not _COMMITS:
        _COMMITS.extend(git(CHECKOUT, "rev-list", "--max-count=8", "HEAD").split())
    _COMMITS.append(_COMMITS.pop(0))
    return _COMMITS[-1][:12]


# -- promotion -----------------------------------------------------------------------------------

def test_single_arch_promoted_digest_for_digest_without_moving_layers(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r, payload_size=4 << 20)   # 4 MB incompressible layer
    with FaultProxy(upstream=("127.0.0.1", int(HOST.rsplit(":", 1)[1])), mode="tcp") as proxy:
        report = release([CPU], space.settings, ReleaseOptions("0.1.0", r, lock_settle_s=0.2,
                                                               trusted=signing.trusted(),
                                                               known_code=signing.known_code(),
                                                               source_check=signing.source_check()),
                         client_for=lambda host: RegistryClient(proxy.address, retry=FAST))
        moved = proxy.bytes_to_client + proxy.bytes_to_upstream
    item = report.images[0]
    assert report.ok and item.status == "promoted", item.problems
    assert sorted(item.tags_made) == ["2.13", "2.13-0.1.0", "latest"]
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert space.resolve(CPU, tag) == digest
    # Only manifests and small configs crossed the wire: far less than the one 4 MB layer.
    assert moved < 1 << 20, moved
    assert space.client.has_blob(space.rel_repo(CPU), json.loads(item._raw)["layers"][0]["digest"])
    # The signed verdict travels with the release, attached to the digest in the release repository.
    [copied] = referrers(space.client, space.rel_repo(CPU), digest, ATTESTATION_TYPE)
    assert item.evidence[0].verdict_ref.endswith(copied.digest)


MULTI = dataclasses.replace(CPU, platforms=("linux/amd64", "linux/arm64"), emulation_factor=4)


def validated_index(space: Space, r: str, verdicts: bool = True) -> tuple[str, list[str]]:
    """A two-platform dev index of MULTI, each platform manifest with its own SBOM, provenance and (unless
    not `verdicts`) verdict, as push and validate attach them: to the platform manifest's digest."""
    repo = space.dev_repo(MULTI)
    index, children = push_index(space.client, repo, names.dev_tag(r, MULTI.version), labels_for(MULTI))
    for child, platform in zip(children, ("linux/amd64", "linux/arm64"), strict=True):
        signing.attest_sbom(space.client, repo, child)
        signing.attach_provenance(space.client, repo, child, signing.provenance(MULTI, platform=platform,
                                                                                revision=commit_of(r)))
        if verdicts:
            store_verdict(space.client, repo, child, verdict(MULTI, child, platform=platform,
                                                             emulated=platform == "linux/arm64"))
    return index, children


def test_multi_arch_index_copied_whole(space: Space) -> None:
    r = rev()
    index, children = validated_index(space, r)
    dev_raw, _, _ = space.client.get_manifest(space.dev_repo(MULTI), index)
    report = space.release([MULTI], r, "0.1.0")
    item = report.images[0]
    assert report.ok, item.problems
    assert [p.platform for p in item.platforms] == ["linux/amd64", "linux/arm64"]
    assert space.resolve(MULTI, "2.13-0.1.0") == index
    raw, media_type, _ = space.client.get_manifest(space.rel_repo(MULTI), "2.13-0.1.0")
    assert media_type == OCI_INDEX and raw == dev_raw and sha256_digest(raw) == index   # byte-identical
    for child, ev in zip(children, item.evidence, strict=True):   # every platform, by the same digest
        assert space.client.manifest_digest(space.rel_repo(MULTI), child) == child == ev.digest
        # ... with its own signed verdict beside it in the release repository
        [copied] = referrers(space.client, space.rel_repo(MULTI), child, ATTESTATION_TYPE)
        assert ev.attestation is not None and copied.digest == ev.attestation.digest


def test_an_index_with_one_platform_unvalidated_is_refused_naming_it(space: Space) -> None:
    r = rev()
    index, (amd, arm) = validated_index(space, r, verdicts=False)
    repo = space.dev_repo(MULTI)
    store_verdict(space.client, repo, amd, verdict(MULTI, amd, platform="linux/amd64", emulated=False))
    store_verdict(space.client, repo, index, verdict(MULTI, index, platform="linux/arm64", emulated=True))
    report = space.release([MULTI], r, "0.1.0")
    assert report.images[0].status == "refused"
    assert report.images[0].problems == [f"linux/arm64: {arm} has no verdict in the registry; run `make validate "
                                         f"FRAMEWORK={MULTI.key}` first"]   # one on the index counts for nothing
    assert_nothing_released(space, MULTI)


def test_second_run_is_a_no_op(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r)
    assert space.release([CPU], r, "0.1.0").ok
    lock_before = space.client.manifest_digest(space.rel_repo(CPU), LOCK_TAG)
    again = space.release([CPU], r, "0.1.0")
    assert again.ok and again.images[0].status == "unchanged" and again.images[0].tags_made == []
    assert space.client.manifest_digest(space.rel_repo(CPU), LOCK_TAG) == lock_before   # not even a lock write
    assert space.resolve(CPU, "2.13-0.1.0") == digest


# -- gates ---------------------------------------------------------------------------------------

def assert_nothing_released(space: Space, cell: Cell) -> None:
    assert space.client.tags(space.rel_repo(cell)) == []


def test_unvalidated_digest_refused(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r, result=None)
    report = space.release([CPU], r, "0.1.0")
    assert report.images[0].status == "refused"
    assert report.images[0].problems == [f"{digest} has no verdict in the registry; run `make validate "
                                         f"FRAMEWORK={CPU.key}` first"]
    assert "has no verdict" in report.images[0].problems[0]
    assert_nothing_released(space, CPU)


def test_failed_verdict_refused(space: Space) -> None:
    r = rev()
    failed = [{"id": "pytorch/test_ddp.py::test_ddp", "group": "pytorch", "result": "failed", "skip_reason": ""},
              {"id": "common/test_x.py::test_x", "group": "common", "result": "passed", "skip_reason": ""}]
    space.build(CPU, r, result="failed", tests=failed)
    report = space.release([CPU], r, "0.1.0")
    assert report.images[0].status == "refused"
    assert "'failed'" in report.images[0].problems[0] and "test_ddp" in report.images[0].problems[0]
    assert_nothing_released(space, CPU)


def test_verdict_of_another_digest_does_not_count(space: Space) -> None:
    r = rev()
    tested = space.build(CPU, r)                     # tested image ...
    untested = space.build(CPU, r, result=None)      # ... then the dev tag is overwritten by an untested one
    report = space.release([CPU], r, "0.1.0")
    assert report.images[0].status == "refused" and report.images[0].digest == untested != tested
    assert report.images[0].problems == [f"{untested} has no verdict in the registry; run `make validate "
                                         f"FRAMEWORK={CPU.key}` first"]
    assert_nothing_released(space, CPU)


def test_gpu_skips_allowed_on_cpu_cell_only(space: Space) -> None:
    skips = [{"id": "common/test_a.py::test_a", "group": "common", "result": "passed", "skip_reason": ""},
             {"id": "pytorch/test_ddp.py::test_nccl", "group": "pytorch", "result": "skipped",
              "skip_code": "gpu-not-in-cell", "skip_reason": "the cell's run profile has no GPUs", "gpu": True}]
    r = rev()
    space.build(CPU, r, tests=skips)
    space.build(GPU, r, tests=skips)
    cpu = space.release([CPU], r, "0.1.0")
    assert cpu.ok, cpu.images[0].problems
    gpu = space.release([GPU], r, "0.1.0")
    assert gpu.images[0].status == "refused"
    assert any("skipped where the matrix expects them to run" in p and "test_nccl (the cell's run profile" in p
               for p in gpu.images[0].problems), gpu.images[0].problems
    assert_nothing_released(space, GPU)


def test_standin_based_image_refused(space: Space) -> None:
    r = rev()
    space.build(NGC, r, **{label_keys.STANDIN: "true"})
    report = space.release([NGC], r, "0.1.0")
    assert report.images[0].status == "refused"
    assert any("stand-in" in p for p in report.images[0].problems)
    assert_nothing_released(space, NGC)


def test_one_refusal_promotes_nothing(space: Space) -> None:
    r = rev()
    space.build(CPU, r)
    space.build(TF_CPU, r, result=None)
    report = space.release([CPU, TF_CPU], r, "0.1.0")
    assert [i.status for i in report.images] == ["not attempted", "refused"]
    assert any("has no verdict in the registry" in p for p in report.images[1].problems), report.images[1].problems
    assert_nothing_released(space, CPU)


def test_version_tag_is_immutable_even_with_force(space: Space) -> None:
    r1, r2 = rev(), rev()
    first = space.build(CPU, r1)
    assert space.release([CPU], r1, "0.1.0").ok
    space.build(CPU, r2)
    for force in (False, True):
        report = space.release([CPU], r2, "0.1.0", force=force)
        assert report.images[0].status == "refused"
        assert "immutable" in report.images[0].problems[0]
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert space.resolve(CPU, tag) == first


def test_moving_tags_follow_the_newest_release(space: Space) -> None:
    r1, r2, r3 = rev(), rev(), rev()
    d1, d2, d3 = space.build(CPU, r1), space.build(CPU, r2), space.build(CPU, r3)
    assert space.release([CPU], r1, "0.1.0").ok
    assert space.release([CPU], r2, "0.2.0").ok
    assert space.resolve(CPU, "latest") == d2 and space.resolve(CPU, "2.13-0.1.0") == d1
    hotfix = space.release([CPU], r3, "0.1.1")      # older than 0.2.0: latest stays
    assert hotfix.ok
    assert {t.tag: t.action for t in hotfix.images[0].tags} == {"2.13-0.1.1": "create", "2.13": "keep",
                                                                 "latest": "keep"}
    assert space.resolve(CPU, "latest") == d2 and space.resolve(CPU, "2.13-0.1.1") == d3
    forced = space.release([CPU], r3, "0.1.1", force=True)   # a deliberate roll-back moves them
    assert forced.ok and space.resolve(CPU, "latest") == d3


def test_dry_run_writes_nothing(space: Space) -> None:
    r = rev()
    space.build(CPU, r)
    report = space.release([CPU], r, "0.1.0", dry_run=True)
    assert report.ok and report.images[0].status == "dry-run"
    assert [t.action for t in report.images[0].tags] == ["create", "create", "create"]
    assert_nothing_released(space, CPU)


# -- faults and concurrency ----------------------------------------------------------------------

def proxied(proxy: FaultProxy) -> RegistryClient:
    return RegistryClient(proxy.address, retry=FAST)


def upstream() -> tuple[str, int]:
    return "127.0.0.1", int(HOST.rsplit(":", 1)[1])


def test_transient_faults_are_retried(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r)
    with FaultProxy(upstream=upstream()) as proxy:
        proxy.add(r"PUT .*/rel/.*/manifests/2\.13-0\.1\.0", "503", times=2)
        proxy.add(r"POST .*/rel/.*/blobs/uploads/\?mount=", "reset")
        proxy.add(r"HEAD .*/rel/.*/manifests/latest", "stall", stall_s=3)   # longer than the 2 s timeout
        report = space.release([CPU], r, "0.1.0", client=proxied(proxy))
        fired = sorted(s.fault for s in proxy.faults())
    assert report.ok, report.images[0].problems
    assert fired == ["503", "503", "reset", "stall"]
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert space.resolve(CPU, tag) == digest


def test_registry_down_mid_release_is_reported_and_rerun_completes(space: Space) -> None:
    r = rev()
    cpu, tf = space.build(CPU, r), space.build(TF_CPU, r)
    with FaultProxy(upstream=upstream()) as proxy:
        # The registry goes away once the second image's tags are being written, and stays away.
        proxy.add(r"PUT .*/rel/tensorflow-cpu/manifests/2\.21-0\.1\.0", "reset", times=10_000)
        report = space.release([CPU, TF_CPU], r, "0.1.0", client=proxied(proxy))
    status = {i.cell: i for i in report.images}
    assert not report.ok
    assert status[CPU.key].status == "promoted" and status[CPU.key].tags_made
    assert status[TF_CPU.key].status == "failed" and status[TF_CPU.key].tags_made == []
    assert status[TF_CPU.key].problems          # says why
    assert space.resolve(TF_CPU, "2.21-0.1.0") is None
    # Re-running once the registry is back completes the release; the done part is a no-op.
    again = space.release([CPU, TF_CPU], r, "0.1.0")
    assert again.ok
    assert [i.status for i in again.images] == ["unchanged", "promoted"]
    assert space.resolve(CPU, "latest") == cpu and space.resolve(TF_CPU, "latest") == tf


def test_concurrent_releases_of_one_version_do_not_corrupt_each_other(space: Space) -> None:
    r1, r2 = rev(), rev()
    digests = {r1: space.build(CPU, r1), r2: space.build(CPU, r2)}
    reports: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def run(r: str) -> None:
        client = RegistryClient(HOST, retry=FAST)
        barrier.wait()
        reports[r] = space.release([CPU], r, "0.1.0", client=client)

    threads = [threading.Thread(target=run, args=(r,)) for r in (r1, r2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    outcomes = {r: rep.images[0].status for r, rep in reports.items()}
    winners = [r for r, s in outcomes.items() if s == "promoted"]
    assert len(winners) == 1, outcomes
    loser = r2 if winners[0] == r1 else r1
    # The loser either lost the lock (not attempted) or found the tag taken under it (refused/failed);
    # either way it promoted nothing, its release fails and it says why.
    assert outcomes[loser] in ("refused", "failed", "not attempted")
    assert not reports[loser].ok and reports[loser].images[0].problems
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert space.resolve(CPU, tag) == digests[winners[0]]


def test_concurrent_identical_releases_both_succeed(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r)
    reports = []
    barrier = threading.Barrier(2)

    def run() -> None:
        client = RegistryClient(HOST, retry=FAST)
        barrier.wait()
        reports.append(space.release([CPU], r, "0.1.0", client=client))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(reports) == 2 and all(rep.ok for rep in reports), [rep.images[0].problems for rep in reports]
    assert sorted(rep.images[0].status for rep in reports) == ["promoted", "unchanged"]
    assert space.resolve(CPU, "latest") == digest


def test_held_lock_makes_another_release_wait_then_report(space: Space) -> None:
    from buildtool.release.repo_lock import RepoLock

    r = rev()
    space.build(CPU, r)
    space.client.put_blob(space.rel_repo(CPU), b"{}")
    holder = RepoLock(RegistryClient(HOST, retry=FAST), space.rel_repo(CPU), settle_s=0.1, purpose="test holder")
    holder.acquire()
    try:
        report = space.release([CPU], r, "0.1.0", lock_wait_s=1.0)
    finally:
        holder.release()
    item = report.images[0]
    assert not report.ok and item.status == "not attempted"
    assert "test holder" in item.problems[0]
    assert space.resolve(CPU, "2.13-0.1.0") is None
    assert space.release([CPU], r, "0.1.0").ok      # once released, the lock is free again


def test_a_declined_mount_of_a_blob_the_source_lacks_is_an_error(space: Space) -> None:
    """A declined mount is completed by an upload from the source (tests/integration/test_hosted_registries.py);
    a source that does not hold the blob leaves nothing to upload."""
    from buildtool.registry.client import RegistryError
    from buildtool.release.execute import copy_manifest

    r = rev()
    digest = space.build(CPU, r)
    raw, media_type, _ = space.client.get_manifest(space.dev_repo(CPU), digest)
    with pytest.raises(RegistryError, match="declined to mount"):
        # A source repository that lacks the blobs: the registry opens an upload instead of mounting.
        copy_manifest(space.client, f"{space.prefix}/empty", space.rel_repo(CPU), raw, media_type, digest)
    assert space.client.manifest_digest(space.rel_repo(CPU), digest) is None


# -- the command, end to end ---------------------------------------------------------------------

def git(root: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True, timeout=30).stdout.strip()


def commit_image_tests(project: Path) -> str:
    """A small image-tests/ committed in the project: one test per group, named as tests/signing.py
    names a verdict's tests, collectable as release collects them. Returns its code hash, which the
    verdicts of the CLI tests carry (release compares it with image-tests as committed)."""
    from buildtool.validate.collect import image_tests_hash

    tests = project / "image-tests"
    shutil.rmtree(tests, ignore_errors=True)     # in place of the project's copy of the real one
    tests.mkdir()
    (tests / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --import-mode=importlib\n"
                                      "markers =\n    gpu: needs a GPU\n")
    (tests / "conftest.py").write_text("def pytest_addoption(parser):\n    parser.addoption('--target')\n")
    for group in ("common", "pytorch", "tensorflow"):
        (tests / group).mkdir()
        (tests / group / "test_x.py").write_text(f"def test_{group}():\n    pass\n")
    for framework in ("pytorch", "tensorflow"):   # a framework is its folder: its row and the scripts it names
        shutil.copy2(REPO / "image-tests" / framework / "framework.yaml", tests / framework / "framework.yaml")
        shutil.copytree(REPO / "image-tests" / framework / "scripts", tests / framework / "scripts")
    git(project, "add", "image-tests")
    git(project, "commit", "-qm", "image tests")
    return image_tests_hash(tests)


def trust(project: Path) -> None:
    """The project trusts the test key as builder (it signs the SBOMs) and tester (the verdicts), as
    config/trusted-keys.yaml would list CI keys."""
    from buildtool.attest.keys import trusted_entry

    (project / "config").mkdir(exist_ok=True)
    entry = trusted_entry("test", signing.KEY.public(), ("builder", "tester"))
    (project / "config/trusted-keys.yaml").write_text("keys:\n" + entry)
    git(project, "add", "config/trusted-keys.yaml")
    git(project, "commit", "-qm", "trust the test runner's key")


def test_release_command_end_to_end(project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    space = Space(project)
    trust(project)
    code_of = {"test_code": commit_image_tests(project), "matrix_digest": signing.committed_matrix(project)}
    monkeypatch.setenv("REGISTRY", f"{HOST}/{space.prefix}")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.chdir(project)
    matrix = str(project / "matrix.yaml")
    first = git(project, "rev-parse", "--short=12", "HEAD")
    cpu1 = space.build(CPU, first, verdict_changes=code_of,
                       **{label_keys.PACKAGES: json.dumps({"tensorboard": "2.21.0"})})
    tf1 = space.build(TF_CPU, first, verdict_changes=code_of)

    code, out, err = run_cli("release", "--version", "nope", "--matrix", matrix)
    assert code == 2 and "is not a version" in err

    code, out, err = run_cli("release", "--version", "0.1.0", "--framework", "pytorch-cpu,tensorflow-cpu,pytorch-ngc",
                             "--matrix", matrix)
    assert code == 1 and "refused for pytorch-ngc:25.10" in err and "nothing was promoted" in err
    assert not (project / "docs/releases/0.1.0.json").exists()

    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "-f", "tensorflow-cpu",
                             "--matrix", matrix, "--json")
    assert code == 0, err
    assert json.loads(out)["ok"] is True
    manifest = json.loads((project / "docs/releases/0.1.0.json").read_text())
    assert manifest["source_commit"] == first
    by_cell = {img["cell"]: img for img in manifest["images"]}
    assert by_cell[CPU.key]["digest"] == cpu1 and by_cell[TF_CPU.key]["digest"] == tf1
    assert by_cell[CPU.key]["tags"] == ["2.13-0.1.0", "2.13", "latest"]
    assert by_cell[CPU.key]["verdict"]["ref"].startswith(f"{HOST}/{space.prefix}/pytorch-cpu-dev@sha256:")
    assert by_cell[CPU.key]["versions"]["tensorboard"] == "2.21.0"
    notes = (project / "docs/releases/0.1.0.md").read_text()
    assert f"`{cpu1}`" in notes and "first release" in notes
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert RegistryClient(HOST).manifest_digest(f"{space.prefix}/pytorch-cpu", tag) == cpu1

    # A second commit with a newer framework build: 0.2.0 moves the moving tags; notes say what changed.
    (project / "CHANGE").write_text("x")
    git(project, "add", "CHANGE")
    git(project, "commit", "-qm", "change")
    second = git(project, "rev-parse", "--short=12", "HEAD")
    cpu2 = space.build(CPU, second, payload_size=256 * 1024, verdict_changes=code_of, **{
        label_keys.FRAMEWORK_VERSION: "2.13.1+cpu", label_keys.PACKAGES: json.dumps({"tensorboard": "2.22.0"})})
    code, out, err = run_cli("release", "--version", "0.2.0", "--from", second, "-f", "pytorch-cpu",
                             "--matrix", matrix)
    assert code == 0, err
    notes = (project / "docs/releases/0.2.0.md").read_text()
    assert "Changes since release 0.1.0" in notes
    assert "framework: pytorch 2.13.0+cpu -> pytorch 2.13.1+cpu" in notes
    assert "tensorboard: 2.21.0 -> 2.22.0" in notes and "size:" in notes
    assert RegistryClient(HOST).manifest_digest(f"{space.prefix}/pytorch-cpu", "latest") == cpu2

    # Re-running 0.1.0 from the first commit: a no-op that still succeeds and rewrites identical files.
    before = (project / "docs/releases/0.1.0.json").read_text()
    code, out, err = run_cli("release", "--version", "0.1.0", "--from", first, "-f", "pytorch-cpu,tensorflow-cpu",
                             "--matrix", matrix)
    assert code == 0, err
    assert "unchanged" in out
    assert (project / "docs/releases/0.1.0.json").read_text() == before
    assert RegistryClient(HOST).manifest_digest(f"{space.prefix}/pytorch-cpu", "latest") == cpu2


def test_command_reports_partial_release_without_leaking_credentials(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    space = Space(project)
    trust(project)
    secret = f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv("REGISTRY_USER", "releaser")
    monkeypatch.setenv("REGISTRY_PASSWORD", secret)       # for the proxy's address only (REGISTRY_AUTH_HOST below)
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.chdir(project)
    code_of = {"test_code": commit_image_tests(project), "matrix_digest": signing.committed_matrix(project)}
    revision = git(project, "rev-parse", "--short=12", "HEAD")
    space.build(CPU, revision, verdict_changes=code_of)
    space.build(TF_CPU, revision, verdict_changes=code_of)
    with FaultProxy(upstream=upstream()) as proxy:
        monkeypatch.setenv("REGISTRY", f"{proxy.address}/{space.prefix}")
        monkeypatch.setenv("REGISTRY_AUTH_HOST", proxy.address)   # sent only if the registry asks: it does not
        proxy.add(r"PUT .*/tensorflow-cpu/manifests/2\.21-0\.1\.0", "reset", times=10_000)
        code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu,tensorflow-cpu",
                                 "--matrix", str(project / "matrix.yaml"))
    assert code == 1
    assert "incomplete" in err and "Promoted: pytorch-cpu:2.13 (2.13-0.1.0, 2.13, latest)" in err
    assert "Not promoted: tensorflow-cpu:2.21: failed" in err and "Re-run the same command" in err
    assert not (project / "docs/releases/0.1.0.json").exists()
    assert secret not in out + err + caplog.text


def test_runner_skip_refused_unless_waived_and_the_waiver_is_recorded(space: Space) -> None:
    from buildtool.release.notes import build_manifest, render_notes

    tests = [{"id": "common/test_a.py::test_a", "group": "common", "result": "passed", "skip_reason": ""},
             {"id": "common/test_run_profile.py::test_ulimit[memlock]", "group": "common", "result": "skipped",
              "skip_code": "ulimit-not-granted", "skip_subject": "memlock",
              "skip_reason": "this runner's Docker engine cannot grant --ulimit memlock=-1"}]
    r = rev()
    space.build(CPU, r, tests=tests)
    first = space.release([CPU], r, "0.1.0").images[0]
    assert first.status == "refused"
    assert any("1 test(s) skipped where the matrix expects them to run" in p and "test_ulimit[memlock]" in p
               for p in first.problems), first.problems
    assert_nothing_released(space, CPU)
    report = space.release([CPU], r, "0.1.0", accept_skips=("ulimit-not-granted:memlock",))
    assert report.ok
    notes = render_notes(build_manifest(report))
    assert "WAIVED by the releaser: --accept-skip ulimit-not-granted:memlock" in notes


def test_registry_dying_mid_tagging_leaves_a_report_and_a_stale_lock_that_a_rerun_takes(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r)
    with FaultProxy(upstream=upstream()) as proxy:
        proxy.go_down_at(r"PUT .*/rel/pytorch-cpu/manifests/2\.13$")      # after the version tag, before the rest
        report = space.release([CPU], r, "0.1.0", client=proxied(proxy))
    item = report.images[0]
    assert not report.ok and item.status == "failed"
    # The moving tags are written side by side after the version tag: `latest` may have landed
    # before the registry went down; what the report lists as made is exactly what is there.
    assert item.tags_made[0] == "2.13-0.1.0" and "2.13" not in item.tags_made
    assert "unreachable" in item.problems[-1]
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert (space.resolve(CPU, tag) == digest) == (tag in item.tags_made)
    lock = space.client.get_manifest(space.rel_repo(CPU), LOCK_TAG)[0]
    assert json.loads(lock)["annotations"][label_keys.LOCK_RELEASED] == "false"   # could not be released
    again = space.release([CPU], r, "0.1.0", lock_wait_s=2.0)     # the holder is gone: its lock is stale
    assert again.ok and again.images[0].status == "promoted"
    latest = "exists" if "latest" in item.tags_made else "create"
    assert {t.tag: t.action for t in again.images[0].tags} == {"2.13-0.1.0": "exists", "2.13": "create",
                                                                "latest": latest}
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert space.resolve(CPU, tag) == digest


def test_concurrent_releases_of_two_versions_leave_latest_on_the_newer(space: Space) -> None:
    r1, r2 = rev(), rev()
    d1, d2 = space.build(CPU, r1), space.build(CPU, r2)
    barrier = threading.Barrier(2)
    reports = []

    def run(r: str, version: str) -> None:
        client = RegistryClient(HOST, retry=FAST)
        barrier.wait()
        reports.append(space.release([CPU], r, version, client=client))

    threads = [threading.Thread(target=run, args=a) for a in ((r1, "0.1.0"), (r2, "0.2.0"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(reports) == 2 and all(rep.ok for rep in reports)
    assert space.resolve(CPU, "2.13-0.1.0") == d1 and space.resolve(CPU, "2.13-0.2.0") == d2
    assert space.resolve(CPU, "latest") == d2 and space.resolve(CPU, "2.13") == d2   # whichever ran last


# -- the lock's settle wait and what is done in it ---------------------------------------------

def test_work_in_the_lock_settle_runs_once_and_a_lost_race_is_retaken_without_it(space: Space) -> None:
    from buildtool.release.repo_lock import RepoLock

    repo = space.rel_repo(CPU)
    space.client.put_blob(repo, b"{}")
    lock = RepoLock(RegistryClient(HOST, retry=FAST), repo, settle_s=0.05, purpose="settling")
    contender = RepoLock(RegistryClient(HOST, retry=FAST), repo, purpose="contender")
    seen: list[str | None] = []

    def work() -> None:
        holder = lock._holder()
        seen.append(holder[0] if holder else None)
        # A contender's lock write lands inside our settle wait: the read-back must see it and
        # we must not think we hold the lock. (Its holder is this process and not active, so it
        # is stale at once and the next attempt takes the lock over.)
        if len(seen) == 1:
            space.client.put_manifest(repo, LOCK_TAG, contender._record(released=False), OCI_MANIFEST)

    first_write = []
    real_put = lock.client.put_manifest

    def recording_put(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        digest = real_put(*args, **kw)
        first_write.append(digest)
        return digest

    lock.client.put_manifest = recording_put  # type: ignore[method-assign]
    lock.acquire(while_settling=work)
    try:
        assert seen == [first_write[0]]        # ran once, after our first write, before the read-back
        assert len(first_write) == 2           # lost the race, wrote again; the work was not repeated
        assert lock.still_held() and lock.digest == first_write[1]
    finally:
        lock.release()


def test_a_fault_while_staging_fails_the_image_with_no_tag_and_the_lock_released(space: Space) -> None:
    r = rev()
    digest = space.build(CPU, r)
    raw, _, _ = space.client.get_manifest(space.dev_repo(CPU), digest)
    config = json.loads(raw)["config"]["digest"]
    with FaultProxy(upstream=upstream()) as proxy:
        # The image's config blob cannot be mounted (the staging done while the lock settles).
        proxy.add(rf"POST .*/rel/pytorch-cpu/blobs/uploads/\?mount={config}", "reset", times=10_000)
        report = space.release([CPU], r, "0.1.0", client=proxied(proxy))
    item = report.images[0]
    assert not report.ok and item.status == "failed" and item.tags_made == []
    assert "unreachable" in item.problems[-1], item.problems
    for tag in ("2.13-0.1.0", "2.13", "latest"):
        assert space.resolve(CPU, tag) is None
    lock = json.loads(space.client.get_manifest(space.rel_repo(CPU), LOCK_TAG)[0])
    assert lock["annotations"][label_keys.LOCK_RELEASED] == "true"
    assert space.release([CPU], r, "0.1.0").ok      # nothing half-done stands in the way of a re-run


def test_a_malformed_trusted_keys_file_is_bad_input_even_when_no_image_reaches_its_verdict(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    # The keys are read in a thread while the registry answers; a release refused before any verdict
    # was read (no dev image here) must still say that the keys file is broken, as bad input.
    space = Space(project)
    (project / "config").mkdir(exist_ok=True)
    (project / "config/trusted-keys.yaml").write_text("keys: [\n")
    git(project, "add", "config/trusted-keys.yaml")
    git(project, "commit", "-qm", "a broken keys file")
    monkeypatch.setenv("REGISTRY", f"{HOST}/{space.prefix}")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.chdir(project)
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--matrix",
                             str(project / "matrix.yaml"))
    assert code == 2 and "config/trusted-keys.yaml:2: YAML syntax" in err, (out, err)
    assert not (project / "docs/releases").exists()


@pytest.mark.parametrize("shape", ["two keys mappings", "one key under two names"])
def test_a_trusted_keys_file_that_says_two_things_refuses_a_release_that_would_pass(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:  # noqa: ANN001
    """Issue 20, hole 2: both shapes were accepted without a word; now exit 2 naming the line(s),
    although the image, its verdict and the key that signed it are otherwise all good."""
    from buildtool.attest.keys import trusted_entry

    space = Space(project)
    entry = trusted_entry("ci-2026", signing.KEY.public())
    text = ("keys: []\nkeys:\n" + entry if shape == "two keys mappings"
            else "keys:\n" + entry + trusted_entry("ci-old", signing.KEY.public()))
    (project / "config").mkdir(exist_ok=True)
    (project / "config/trusted-keys.yaml").write_text(text)
    git(project, "add", "config/trusted-keys.yaml")
    git(project, "commit", "-qm", "keys")
    monkeypatch.setenv("REGISTRY", f"{HOST}/{space.prefix}")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.chdir(project)
    space.build(CPU, git(project, "rev-parse", "--short=12", "HEAD"))
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--dry-run", "--matrix",
                             str(project / "matrix.yaml"))
    if shape == "two keys mappings":
        assert code == 2 and "config/trusted-keys.yaml:2: keys: duplicate key (already set on line 1)" in err, err
    else:
        second = 2 + entry.count("\n")
        assert code == 2 and "listed twice: ci-2026 (line 2) and ci-old (line " + str(second) + ")" in err, err
    assert not (project / "docs/releases").exists()


def test_a_verdict_of_test_code_git_does_not_hold_is_refused_naming_both_revisions(
        project: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Issue 20, hole 6: a runner with a trusted key ran edited image-tests (its code hash is neither
    image-tests at the image's revision nor at the release commit): refused, with the hashes git gives.
    A verdict of image-tests as committed at the image's own revision, released from a later commit
    whose image-tests changed, is accepted."""
    from buildtool.validate.collect import image_tests_hash

    space = Space(project)
    trust(project)
    committed = commit_image_tests(project)
    monkeypatch.setenv("REGISTRY", f"{HOST}/{space.prefix}")
    monkeypatch.delenv("RELEASE_REGISTRY", raising=False)
    monkeypatch.chdir(project)
    first = git(project, "rev-parse", "--short=12", "HEAD")
    (project / "image-tests/common/test_x.py").write_text("def test_common():\n    assert True  # edited\n")
    edited = image_tests_hash(project / "image-tests")
    git(project, "checkout", "--", "image-tests")
    matrix = signing.committed_matrix(project)
    space.build(CPU, first, verdict_changes={"test_code": edited, "matrix_digest": matrix})
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "pytorch-cpu", "--dry-run", "--matrix",
                             str(project / "matrix.yaml"), "--json")
    assert code == 1, err
    [problem] = json.loads(out)["status"][CPU.key]["problems"]
    assert f"the verdict ran image-tests {edited}, which is neither image-tests at the image's revision nor at the " \
           "release commit" in problem, problem
    assert f"the image's revision {git(project, 'rev-parse', '--short=12', first)}: {committed}" in problem

    # The same release from a later commit with other image-tests: the image's own revision still counts.
    (project / "image-tests/common/test_y.py").write_text("def test_more():\n    pass\n")
    git(project, "add", "image-tests")
    git(project, "commit", "-qm", "more image tests")
    space.build(TF_CPU, first, verdict_changes={"test_code": committed, "matrix_digest": matrix})
    code, out, err = run_cli("release", "--version", "0.1.0", "-f", "tensorflow-cpu", "--from", first, "--dry-run",
                             "--matrix", str(project / "matrix.yaml"), "--json")
    assert code == 0, (out, err)
    assert json.loads(out)["status"][TF_CPU.key]["status"] == "dry-run"


def skopeo_tags(repo: str) -> set[str]:
    import subprocess

    out = subprocess.run(["skopeo", "list-tags", "--tls-verify=false", f"docker://{HOST}/{repo}"], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return set(json.loads(out)["Tags"])


@pytest.mark.parametrize("lost", [r"2\.13-0\.1\.0$", r"/2\.13$", r"/latest$"])
def test_after_a_fault_the_report_lists_exactly_the_tags_the_registry_holds(space: Space, lost: str) -> None:
    """Issue 20, hole 7: a tag write lands but its answer is lost (reset after the write, on every
    retry): the report said "Promoted: none" / one tag while the registry held more. After any
    failure release reads the tags back: reported == `skopeo list-tags`."""
    r = rev()
    digest = space.build(CPU, r)
    with FaultProxy(upstream=upstream()) as proxy:
        proxy.add(rf"PUT .*/rel/pytorch-cpu/manifests{lost if lost.startswith('/') else '/' + lost}", "lost",
                  times=10_000)
        report = space.release([CPU], r, "0.1.0", client=proxied(proxy))
    item = report.images[0]
    assert not report.ok and item.status == "failed", item.problems
    release_tags = {"2.13-0.1.0", "2.13", "latest"}
    held = skopeo_tags(space.rel_repo(CPU)) & release_tags
    assert set(item.tags_made) == held and item.tags_unknown == [], (item.tags_made, held)
    assert {t for t in held if space.resolve(CPU, t) == digest} == held
    assert any("read back" in p for p in item.problems), item.problems
