"""SLSA provenance (issue 25): what a push states and signs, what the reader accepts and rejects (and why),
what release requires of it, and the verdict's tester role. No engine, no registry: payload level and
pure gates here; the registry and the push path are in tests/integration/test_provenance_registry.py."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from buildtool.attest.provenance_model import PREDICATE_TYPE, ProvenanceError, builder_id_problem, parse_provenance
from buildtool.attest.provenance_store import sign_provenance, verify
from buildtool.attest.referrers import Payload
from buildtool.common.errors import FailedError, UserError
from buildtool.contracts import label_keys
from buildtool.contracts.apt_lock_format import parse_apt_lock
from buildtool.imagebuild import provenance as build_provenance
from buildtool.imagebuild.archive_state import ReleaseFile
from buildtool.matrix.plan import CellPlan
from buildtool.release.ancestry import revision_problem
from buildtool.release.gates import Platform, StandIns, provenance_problems
from buildtool.validate.verdicts import _verify
from tests.conftest import fixture_matrix
from tests.signing import (
    ATTACKER,
    BASE_DIGEST,
    KEY,
    envelope,
    provenance,
    provenance_envelope,
    tamper,
    trusted,
    verdict,
)

CPU = next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13")
APT_LOCK = Path(__file__).parent / "fixtures/project/dockerfiles/pytorch/pytorch-cpu/2.13/apt.lock"
# What BuildKit writes into the history of the steps (the base's entry, then RUN steps with their build args).
HISTORY = tuple({"created": "2026-01-01T00:00:00Z", "created_by": step} for step in (
    "mmdebstrap --variant=minbase bookworm, recipe 3", "ARG SOURCE_DATE_EPOCH=0",
    "RUN |2 SOURCE_DATE_EPOCH=0 DEBIAN_FRONTEND=noninteractive /bin/bash -o pipefail -c touch /run/stamp",
    "RUN |1 SOURCE_DATE_EPOCH=0 /bin/bash -o pipefail -c x"))
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
DSSE = "application/vnd.dsse.envelope.v1+json"
REV = "a" * 40


def body(**changes: object) -> dict:
    return provenance(CPU, revision=REV, **changes)  # type: ignore[arg-type]


def read(data: bytes, digest: str = D1, keys=None):  # noqa: ANN001, ANN201
    return verify([Payload(DSSE, data)], digest, keys or trusted())


# -- what a push states ---------------------------------------------------------------------------

def _project(tmp_path: Path) -> tuple[Path, CellPlan]:
    from buildtool.imagebuild import aptlock
    from buildtool.imagebuild.lock import lock_paths

    root = tmp_path / "project"
    for path in [*lock_paths(root, CPU).values(), *aptlock.paths(root, CPU), aptlock.hashes_path(root, CPU)]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.name}\n")
    # A real apt.lock: the provenance names the base it was resolved in (its header).
    aptlock.paths(root, CPU)[0].write_text(APT_LOCK.read_text())
    (root / "templates").mkdir()
    (root / "templates/uv.lock").write_text((Path(__file__).resolve().parents[1] / "templates/uv.lock").read_text())
    (root / "matrix.yaml").write_text("matrix: as built\n")
    plan = CellPlan(cell=CPU, revision=REV[:12], dev_repo="127.0.0.1:5000/pytorch-cpu-dev", dev_tag=f"{REV[:12]}-2.13",
                    release_repo="127.0.0.1:5000/pytorch-cpu", release_tags=(), moving_tags=(), base=CPU.base)
    return root, plan


LABELS = {label_keys.OCI_REVISION: REV, label_keys.OCI_SOURCE: "https://example.invalid/dl-images",
          label_keys.OCI_BASE_NAME: "127.0.0.1:5000/library/debian:bookworm-slim",
          label_keys.OCI_BASE_DIGEST: BASE_DIGEST, label_keys.BASE_UPSTREAM: CPU.base, label_keys.CELL: CPU.key}


FACTS = build_provenance.BuildFacts(
    build_args={"BASE_IMAGE": f"127.0.0.1:5000/library/debian:bookworm-slim@{BASE_DIGEST}",
                "BUILDKIT_INLINE_CACHE": "1"},
    secrets=("pip.conf", "uv.toml"), network="host", buildkit="classic", created_epoch=1767225600,
    package_indexes=(("https://pypi.org/simple", "index-url"), ("file:///opt/wheels", "find-links")),
    cache_from=(f"127.0.0.1:5000/pytorch-cpu-dev@sha256:{'e' * 64}",),
    archive=(ReleaseFile("http://deb.debian.org/debian/dists/bookworm/InRelease", "f" * 64, "2026-11-15T09:30:00Z",
                         False),),
    inline_cache=f"127.0.0.1:5000/pytorch-cpu-dev@sha256:{'9' * 64}", config_rewrite="created, history[].created")


def _made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, labels: dict[str, str] = LABELS,  # noqa: ANN202
          facts: build_provenance.BuildFacts = FACTS, history: tuple[dict, ...] = HISTORY):
    monkeypatch.setattr(build_provenance, "docker_versions", lambda: ("20.10.24", "20.10.24+dfsg1"))
    monkeypatch.setattr(build_provenance, "git_ref", lambda root: "refs/heads/main")
    client = tmp_path / "docker"
    client.write_bytes(b"a docker client")
    monkeypatch.setattr(build_provenance, "client_binary", lambda: str(client))
    monkeypatch.setattr(build_provenance, "deb_owner",
                        lambda path: ("docker.io", "20.10.24+dfsg1-1+deb12u1+b6", "amd64") if path == str(client)
                        or path.endswith("dockerd") else None)
    monkeypatch.setenv("DL_IMAGES_BUILDER_ID", "https://ci.example.invalid/runs/7")
    root, plan = _project(tmp_path)
    started, finished = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC), datetime(2026, 1, 1, 0, 2, 5, tzinfo=UTC)
    made = build_provenance.make_provenance(root, root / "matrix.yaml", plan,
                                            build_provenance.Built(labels, "linux/amd64", history), (started, finished),
                                            build_provenance.tools(root), facts, KEY.keyid)
    return root, made


def descriptor_rule_breaks(predicate: dict) -> list[str]:
    """in-toto's ResourceDescriptor rule, written here from the spec (not buildtool's parser): each descriptor
    sets at least one of uri, digest and content. The names of those that do not."""
    descriptors = [*predicate["buildDefinition"]["resolvedDependencies"],
                   *predicate["runDetails"].get("byproducts", [])]
    return [d.get("name", "?") for d in descriptors if not (d.get("uri") or d.get("digest") or d.get("content"))]


def _nacl_open(data: bytes, public_pem: str) -> dict:
    """Verify a DSSE envelope with PyNaCl and PAE written here from the DSSE v1 spec (not buildtool's code):
    the statement, or AssertionError."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key
    from nacl.signing import VerifyKey

    envelope_ = json.loads(data)
    payload = base64.b64decode(envelope_["payload"])
    kind = envelope_["payloadType"].encode()
    signed = b"DSSEv1 " + str(len(kind)).encode() + b" " + kind + b" " + str(len(payload)).encode() + b" " + payload
    raw = load_pem_public_key(public_pem.encode()).public_bytes(Encoding.Raw, PublicFormat.Raw)
    [signature] = envelope_["signatures"]
    assert signature["keyid"] == hashlib.sha256(raw).hexdigest()
    VerifyKey(raw).verify(signed, base64.b64decode(signature["sig"]))   # raises BadSignatureError
    assert envelope_["payloadType"] == "application/vnd.in-toto+json"
    return json.loads(payload)


def test_the_provenance_a_push_makes_states_every_field_and_verifies_with_pynacl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, made = _made(tmp_path, monkeypatch)
    data = sign_provenance("127.0.0.1:5000/pytorch-cpu-dev", D1, made, KEY)
    statement = _nacl_open(data, KEY.public().pem)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": "127.0.0.1:5000/pytorch-cpu-dev", "digest": {"sha256": "1" * 64}}]
    definition = statement["predicate"]["buildDefinition"]
    assert definition["buildType"] == \
        "https://github.com/dl-images/dl-images/blob/main/docs/release-trust.md#cell-build-v3"
    matrix = "sha256:" + hashlib.sha256((root / "matrix.yaml").read_bytes()).hexdigest()
    context = str(Path(CPU.dockerfile).parent)
    assert definition["externalParameters"] == {
        "cell": CPU.key, "matrix_digest": matrix, "revision": REV, "source": "https://example.invalid/dl-images",
        "dockerfile": CPU.dockerfile, "context": context, "platform": "linux/amd64", "buildArgs": FACTS.build_args,
        "sourceDateEpoch": 0, "createdEpoch": 1767225600, "secrets": ["pip.conf", "uv.toml"], "network": "host",
        "packageIndexes": [{"url": "https://pypi.org/simple", "role": "index-url"},
                           {"url": "file:///opt/wheels", "role": "find-links"}]}
    assert definition["internalParameters"] == {"buildkit": "classic", "configRewrite": "created, history[].created"}
    deps = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert deps["source"] == {"name": "source", "uri": "git+https://example.invalid/dl-images@refs/heads/main",
                              "digest": {"gitCommit": REV}}
    # Not made here (no recipe label): a copy of the upstream, by tag and by digest.
    assert deps["base"] == {"name": "base", "uri": f"oci://127.0.0.1:5000/library/debian:bookworm-slim@{BASE_DIGEST}",
                            "digest": {"sha256": "b" * 64}, "annotations": {"standin": False, "upstream": CPU.base,
                                                                            "upstreamDigest": BASE_DIGEST}}
    listing = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n"
                      for p in sorted((root / context).iterdir()))
    assert deps["context"] == {"name": "context", "uri": f"git+https://example.invalid/dl-images@refs/heads/main#{context}",
                               "digest": {"sha256": hashlib.sha256(listing.encode()).hexdigest()},
                               "annotations": {"files": len(list((root / context).iterdir())),
                                               "listing": "sha256sum of every file, sorted by path"}}
    from buildtool.imagebuild import aptlock
    from buildtool.imagebuild.lock import lock_paths

    locks = [*lock_paths(root, CPU).values(), *aptlock.paths(root, CPU), aptlock.hashes_path(root, CPU)]
    assert {"apt.lock", "base.dpkg", "debs.sha256"} <= {p.name for p in locks}     # the system layer's files too
    assert {d for d in deps if d.startswith("lock:")} == {f"lock:{p.relative_to(root)}" for p in locks}
    for path in locks:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert deps[f"lock:{path.relative_to(root)}"]["digest"] == {"sha256": digest}
    resolved = parse_apt_lock(APT_LOCK.read_text()).header["resolved-in"]
    assert deps[f"lock:{aptlock.paths(root, CPU)[0].relative_to(root)}"]["annotations"] == {"resolvedIn": resolved}
    assert "@sha256:" in resolved
    debian = "pkg:deb/debian/docker.io@20.10.24%2Bdfsg1-1%2Bdeb12u1%2Bb6?arch=amd64"
    assert deps["tool:docker-client"]["annotations"]["version"] == "20.10.24"
    assert deps["tool:docker-client"]["uri"] == debian
    assert deps["tool:docker-client"]["digest"] == {"sha256": hashlib.sha256(b"a docker client").hexdigest()}
    assert deps["tool:docker-engine"]["annotations"]["version"] == "20.10.24+dfsg1"
    assert deps["tool:docker-engine"]["uri"] == debian     # the engine of the Debian package's version
    assert deps["tool:buildtool"]["uri"] == deps["source"]["uri"]
    assert deps["tool:buildtool"]["digest"] == {"gitCommit": REV}
    assert deps["tool:uv"]["uri"] == "pkg:pypi/uv@0.13.9"
    assert deps["tool:uv"]["digest"]["sha256"] == hashlib.sha256((root / "templates/uv.lock").read_bytes()).hexdigest()
    archive = deps["apt-archive:http://deb.debian.org/debian/dists/bookworm/InRelease"]
    assert archive == {"name": "apt-archive:http://deb.debian.org/debian/dists/bookworm/InRelease",
                       "uri": "http://deb.debian.org/debian/dists/bookworm/InRelease", "digest": {"sha256": "f" * 64},
                       "annotations": {"date": "2026-11-15T09:30:00Z", "publishedDuringBuild": False}}
    assert deps["cache:1"] == {"name": "cache:1", "uri": f"oci://127.0.0.1:5000/pytorch-cpu-dev@sha256:{'e' * 64}",
                               "digest": {"sha256": "e" * 64}}
    run = statement["predicate"]["runDetails"]
    assert run["builder"] == {"id": "https://ci.example.invalid/runs/7", "version": {"buildtool": "0.1.0"}}
    assert run["metadata"]["startedOn"] == "2026-01-01T00:00:00Z"
    assert run["metadata"]["finishedOn"] == "2026-01-01T00:02:05Z"
    assert run["byproducts"] == [{"name": "buildkit-inline-cache", "digest": {"sha256": "9" * 64},
                                  "uri": f"oci://127.0.0.1:5000/pytorch-cpu-dev@sha256:{'9' * 64}"}]
    assert descriptor_rule_breaks(statement["predicate"]) == []
    # The reader gets the same back, signed by the builder.
    back, keyid = read(data)
    assert back == made and keyid == KEY.keyid


def test_every_resource_descriptor_of_a_made_provenance_has_a_uri_digest_or_content(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-toto ResourceDescriptor rule over what a push makes, by a check written from the spec; a tool
    entry with only a name and a version (what pushes wrote before) breaks it, and the parser refuses it."""
    _, made = _made(tmp_path, monkeypatch)
    predicate = made.to_json()
    assert descriptor_rule_breaks(predicate) == []
    predicate["buildDefinition"]["resolvedDependencies"].append(
        {"name": "tool:docker-engine-old", "annotations": {"version": "20.10.24"}})
    assert descriptor_rule_breaks(predicate) == ["tool:docker-engine-old"]
    with pytest.raises(ProvenanceError, match="resource 'tool:docker-engine-old' has none of uri, digest and content"):
        parse_provenance(predicate, "x")


def test_secret_names_are_stated_and_their_values_never_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What engine.build records for the provenance names each secret by its id: not the file it was read from,
    not its content; the provenance made from that record holds neither."""
    from buildtool.imagebuild import engine

    value = "s3cr3t-index-token-4242"
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = https://user:{value}@index.example.invalid/simple\n")
    log = tmp_path / "logs" / "pytorch-cpu-2.13.log"

    real_run = subprocess.run

    def fake_run(argv, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if "--iidfile" not in argv:
            return real_run(argv, **kwargs)
        Path(argv[argv.index("--iidfile") + 1]).write_text("sha256:" + "4" * 64)
        kwargs["stdout"].write("#5 0.180 Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    client = engine.BuildClient(("client-stand-in", "build"), (("DOCKER_BUILDKIT", "1"),), "classic")
    from buildtool.imagebuild.pipconfig import HostPip, package_indexes

    indexes = package_indexes(HostPip(index_url=f"https://user:{value}@index.example.invalid/simple"))
    engine.build(client, engine.BuildRequest(
        tmp_path, tmp_path / "Dockerfile", build_args={"BASE_IMAGE": "b@sha256:" + "b" * 64},
                 labels={}, secrets={"pip.conf": conf}, log_path=log, package_indexes=indexes))
    release = b"Origin: Debian\nDate: Sat, 15 Nov 2025 09:30:00 UTC\n"
    facts = build_provenance.facts_from_build(log, "sha256:" + "4" * 64, 1767225600, fetch=lambda uri: release)
    assert facts.secrets == ("pip.conf",)
    _, made = _made(tmp_path, monkeypatch, facts=facts)
    text = json.dumps(made.to_json())
    assert '"secrets": ["pip.conf"]' in text
    assert value not in text and str(conf) not in text and value not in engine.facts_path(log).read_text()
    assert made.dependency("apt-archive:http://deb.debian.org/debian/dists/bookworm/InRelease") is not None
    # The package index by URL, its credential never (issue 52).
    assert [i.url for i in made.buildDefinition.externalParameters.packageIndexes] == [  # type: ignore[union-attr]
        "https://index.example.invalid/simple"]


def test_an_apt_step_taken_from_the_cache_says_the_archive_was_not_observed(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A build whose apt layer came from the build cache fetched no release file: the provenance says so rather
    than naming what the archive serves today."""
    from buildtool.imagebuild import engine

    log = tmp_path / "x.log"
    log.write_text("#5 [base 2/4] RUN --mount=type=tmpfs,target=/run touch /run/stamp\n#5 CACHED\n")
    engine.facts_path(log).write_text(json.dumps({
        "image": "sha256:" + "4" * 64, "build_args": {}, "secrets": [], "network": "host", "buildkit": "classic",
        "cache_from": [], "started": 1767225600, "package_indexes": []}))
    facts = build_provenance.facts_from_build(log, None, 1767225600, fetch=lambda uri: pytest.fail(uri))
    assert facts.archive is None
    _, made = _made(tmp_path, monkeypatch, facts=facts)
    assert made.named("apt-archive:") == []
    assert made.buildDefinition.internalParameters["aptArchive"].startswith(
        "not observed: the apt step did not run in this build: its layer came from the build cache")


def test_the_facts_of_another_build_are_refused_naming_the_record(tmp_path: Path) -> None:
    from buildtool.imagebuild import engine

    log = tmp_path / "x.log"
    log.write_text("")
    engine.facts_path(log).write_text(json.dumps({"image": "sha256:" + "1" * 64, "package_indexes": []}))
    with pytest.raises(FailedError, match=f"records the build of sha256:{'1' * 64}, not sha256:{'2' * 64}"):
        build_provenance.facts_from_build(log, "sha256:" + "2" * 64, 0)
    with pytest.raises(FailedError, match="no record of the build"):
        build_provenance.facts_from_build(tmp_path / "none.log", "sha256:" + "2" * 64, 0)


@pytest.mark.parametrize(("record", "says"), [
    ([1], "is not a build record (a JSON object, not list)"),
    ("sha256:" + "4" * 64, "is not a build record (a JSON object, not str)"),
    ({"image": "sha256:" + "4" * 64}, "is a record of an older buildtool (it names no package indexes)"),
    ({"image": "sha256:" + "4" * 64, "build_args": {}, "secrets": [], "network": "host", "buildkit": "classic",
      "cache_from": [], "package_indexes": []}, ": field 'started' of the build record: field required"),
    ({"image": "sha256:" + "4" * 64, "build_args": {}, "secrets": [], "network": "host", "buildkit": "classic",
      "cache_from": [], "started": 0, "package_indexes": [{"url": "https://x.example/simple"}]},
     ": field 'package_indexes.0.role' of the build record: field required"),
])
def test_a_build_record_of_the_wrong_shape_is_refused_naming_the_file_and_field(tmp_path: Path, record: object,
                                                                                says: str) -> None:
    """A record that is no JSON object, or lacks or mistypes a field, is one line naming the record and the field,
    before anything is fetched (was: KeyError 'started' or AttributeError after the archive's release files)."""
    from buildtool.imagebuild import engine

    log = tmp_path / "x.log"
    log.write_text("#5 0.180 Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]\n")
    engine.facts_path(log).write_text(json.dumps(record))
    for image in (None, "sha256:" + "4" * 64):
        with pytest.raises(FailedError) as caught:
            build_provenance.facts_from_build(log, image, 0, fetch=lambda uri: pytest.fail(f"fetched {uri}"))
        assert str(caught.value).startswith(str(engine.facts_path(log))) and says in str(caught.value)
        assert "\n" not in str(caught.value) and "rebuild with `buildtool build --force --push`" in str(caught.value)

def test_an_image_whose_cell_was_built_again_since_is_found_by_its_own_record(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """engine.build keeps each build's record by image: pushing an image built before the cell's last build (CI:
    test_second_build_is_a_noop, after another test built the cell) states that image's build, not a refusal."""
    from buildtool.imagebuild import engine

    log = tmp_path / "logs" / "pytorch-cpu-2.13.log"
    built = iter(["sha256:" + "4" * 64, "sha256:" + "5" * 64])

    def fake_run(argv, **kwargs):  # noqa: ANN001, ANN003, ANN202
        image = next(built)
        Path(argv[argv.index("--iidfile") + 1]).write_text(image)
        kwargs["stdout"].write(f"#5 [base 2/4] RUN apt-get install # {image}\n#5 CACHED\n")
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    client = engine.BuildClient(("client-stand-in", "build"), (("DOCKER_BUILDKIT", "1"),), "classic")
    for network in (True, False):
        engine.build(client, engine.BuildRequest(
        tmp_path, tmp_path / "Dockerfile", build_args={"BASE_IMAGE": "b@sha256:" + "b" * 64},
                     labels={}, secrets={}, log_path=log, network_host=network))
    first = build_provenance.facts_from_build(log, "sha256:" + "4" * 64, 0, fetch=lambda uri: pytest.fail(uri))
    assert first.network == "host"          # the first build's record, though the cell's files are the second's
    assert build_provenance.facts_from_build(log, "sha256:" + "5" * 64, 0).network == "default"
    with pytest.raises(FailedError, match=f"records the build of sha256:{'5' * 64}, not sha256:{'6' * 64}"):
        build_provenance.facts_from_build(log, "sha256:" + "6" * 64, 0)


def test_the_builder_id_is_a_documented_uri_per_builder_key_without_a_ci_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DL_IMAGES_BUILDER_ID", raising=False)
    found = build_provenance.builder_id(KEY.keyid)
    assert found == ("https://github.com/dl-images/dl-images/blob/main/docs/release-trust.md"
                     f"?keyid={KEY.keyid}#local-builders")
    assert "local:" not in found and builder_id_problem(found) == ""
    monkeypatch.setenv("DL_IMAGES_BUILDER_ID", "local:root@vm")
    with pytest.raises(UserError, match="builder.id 'local:root@vm' is not an https URI"):
        build_provenance.builder_id(KEY.keyid)


def test_a_builder_id_with_credentials_is_refused_without_showing_them(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A DL_IMAGES_BUILDER_ID with user info (`https://bot:TOKEN@ci.example/...`, a CI URL copied from a clone URL)
    passed the https-URI check and went whole into every provenance the builder key signed: the token was published
    in an attestation anyone who may pull could read."""
    secret = "ghp_Sekr3tT0ken"
    monkeypatch.setenv("DL_IMAGES_BUILDER_ID", f"https://ci-bot:{secret}@ci.example/org/repo/actions/runs/7")
    with pytest.raises(UserError, match="carries credentials") as refused:
        build_provenance.builder_id(KEY.keyid)
    assert secret not in str(refused.value) and "ci.example/org/repo/actions/runs/7" in str(refused.value)
    _, made = _made(tmp_path, monkeypatch)
    predicate = made.to_json()
    predicate["runDetails"]["builder"]["id"] = f"https://{secret}@ci.example/runs/7"
    with pytest.raises(ProvenanceError, match="carries credentials") as read:
        parse_provenance(predicate, "x")
    assert secret not in str(read.value)


def test_a_provenance_whose_builder_id_or_source_is_no_uri_is_refused(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, made = _made(tmp_path, monkeypatch)
    predicate = made.to_json()
    predicate["runDetails"]["builder"]["id"] = "local:root@vm"
    with pytest.raises(ProvenanceError, match="builder.id 'local:root@vm' is not an https URI"):
        parse_provenance(predicate, "x")
    predicate = made.to_json()
    source = next(d for d in predicate["buildDefinition"]["resolvedDependencies"] if d["name"] == "source")
    source["digest"] = {"sha1": REV}
    with pytest.raises(ProvenanceError, match="is not git\\+<URL>@<ref> with a gitCommit digest"):
        parse_provenance(predicate, "x")


def test_a_dirty_revision_names_its_commit_and_says_it_was_dirty() -> None:
    found = build_provenance.source_descriptor("https://example.invalid/r", f"{REV}-dirty.0123abcd", "")
    assert found == {"name": "source", "uri": f"git+https://example.invalid/r@{REV}", "digest": {"gitCommit": REV},
                     "annotations": {"dirty": "0123abcd"}}
    with pytest.raises(FailedError, match="is no repository URL"):
        build_provenance.source_descriptor("", REV, "")


def test_a_base_made_here_names_its_recipe_and_archive_state_and_claims_no_upstream_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = "mmdebstrap --variant=minbase bookworm, recipe 3"
    archive = f"http://deb.debian.org/debian/dists/bookworm/InRelease sha256:{'7' * 64} 2026-07-11T10:16:37Z"
    _, made = _made(tmp_path, monkeypatch, {**LABELS, label_keys.BASE_SOURCE: recipe,
                                            label_keys.BASE_ARCHIVE: archive})
    assert made.base is not None and made.base.annotations == {
        "standin": False, "upstream": CPU.base, "madeBy": recipe,
        "archive": {"uri": "http://deb.debian.org/debian/dists/bookworm/InRelease", "sha256": "7" * 64,
                    "date": "2026-07-11T10:16:37Z"}}
    # Not a copy of the upstream: its digest is this base's, not docker.io's.
    assert "upstreamDigest" not in made.base.annotations


# -- the SOURCE_DATE_EPOCH the steps ran with (issue 52) ------------------------------------------

def test_the_source_date_epoch_stated_is_the_one_the_steps_ran_with_not_the_commit_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault issue 52 found: sourceDateEpoch said the commit time (1767225600 here) while every step ran with
    SOURCE_DATE_EPOCH=0; a rebuilder passing it got other layers. It is now the history's value; the commit time
    the config's times carry is createdEpoch."""
    _, made = _made(tmp_path, monkeypatch)
    params = made.buildDefinition.externalParameters
    assert (params.sourceDateEpoch, params.createdEpoch) == (0, 1767225600)
    ran_with = [{**h, "created_by": h["created_by"].replace("SOURCE_DATE_EPOCH=0", "SOURCE_DATE_EPOCH=1700000000")}
                for h in HISTORY]
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    _, other = _made(tmp_path / "b", monkeypatch, history=tuple(ran_with))
    assert other.buildDefinition.externalParameters.sourceDateEpoch == 1700000000
    # Steps without it: null, stated as such (not a default).
    _, none = _made(tmp_path / "c", monkeypatch, history=HISTORY[:2])
    assert none.buildDefinition.externalParameters.sourceDateEpoch is None
    with pytest.raises(FailedError, match="RUN steps ran with different SOURCE_DATE_EPOCH values \\(0, 1700000000\\)"):
        build_provenance.steps_source_date_epoch((*HISTORY, *ran_with))


# -- package indexes, never their credentials (issue 52) --------------------------------------------

def test_package_indexes_are_recorded_by_url_without_credentials_or_tokens(tmp_path: Path) -> None:
    from buildtool.imagebuild.pipconfig import HostPip, package_indexes

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    host = HostPip(index_url="https://__token__:s3cr3t-A@pypi.example.invalid/simple/",
                   extra_index_urls=("https://user:s3cr3t-B@extra.example.invalid:8443/simple?token=s3cr3t-C#frag",
                                     "https://pypi.example.invalid/simple/"),
                   find_links=(str(wheels), "http://127.0.0.1:9/wheels"))
    found = package_indexes(host, ("https://download.pytorch.org/whl/cpu?access_token=s3cr3t-D",))
    assert found == [{"url": "https://pypi.example.invalid/simple/", "role": "index-url"},
                     {"url": "https://extra.example.invalid:8443/simple", "role": "extra-index-url"},
                     {"url": wheels.as_uri(), "role": "find-links"},
                     {"url": "http://127.0.0.1:9/wheels", "role": "find-links"},
                     {"url": "https://download.pytorch.org/whl/cpu", "role": "cell-index-url"}]
    assert "s3cr3t" not in json.dumps(found) and "__token__" not in json.dumps(found)


def test_a_build_records_the_cells_own_index_url_as_well_as_its_extra_ones(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell's `index: {url: ...}` (its locks were resolved from it) is a `cell-index-url` of the build's record,
    before its extra URLs, without its credential (was: only the extra URLs were passed to engine.build)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from buildtool.imagebuild import builder, engine
    from buildtool.imagebuild.pipconfig import HostPip
    from buildtool.matrix.plan import Settings, plan_cell

    root = Path(__file__).resolve().parents[1]
    cell = replace(next(c for c in fixture_matrix().cells if c.key == "pytorch-cpu:2.13"),
                   index_url="https://__token__:s3cr3t-E@mirror.example.invalid/simple/?token=s3cr3t-F",
                   extra_index_urls=("https://download.pytorch.org/whl/cpu",))
    plan = plan_cell(cell, Settings(registry="127.0.0.1:5999/team"), "nightly-1")
    run = builder.Builder(root, "matrix.yaml", Settings(registry="127.0.0.1:5999/team"), "nightly-1",
                          builder.BuildOptions(log_dir=tmp_path), print)
    seen: list[engine.BuildRequest] = []
    monkeypatch.setattr(builder.engine, "build", lambda client, request: seen.append(request) or "sha256:" + "7" * 64)
    monkeypatch.setattr(builder.Builder, "_build_env", lambda self: (None, SimpleNamespace(files={}), HostPip()))
    monkeypatch.setattr(builder, "build_labels", lambda *args: {})
    base = SimpleNamespace(ref="b", pinned="b@sha256:" + "b" * 64, digest="sha256:" + "b" * 64)
    run._buildkit(plan, base, "sha256:" + "f" * 64, tmp_path / "x.log", None)   # type: ignore[arg-type]
    assert [dict(i) for i in seen[0].package_indexes] == [
        {"url": "https://mirror.example.invalid/simple/", "role": "cell-index-url"},
        {"url": "https://download.pytorch.org/whl/cpu", "role": "cell-index-url"}]
    assert "s3cr3t" not in json.dumps([dict(i) for i in seen[0].package_indexes])


def test_a_provenance_carrying_a_credential_in_an_index_url_is_refused() -> None:
    for url in ("https://u:p@idx.example.invalid/simple", "https://idx.example.invalid/simple?token=x"):
        with pytest.raises(ProvenanceError, match="packageIndexes URL is not a plain URL without credentials"):
            parse_provenance(body(packageIndexes=[{"url": url, "role": "index-url"}]), "x")
    with pytest.raises(ProvenanceError, match="packageIndexes role 'mirror' is not one of"):
        parse_provenance(body(packageIndexes=[{"url": "https://i.example/simple", "role": "mirror"}]), "x")


def test_an_index_token_holding_a_slash_question_mark_or_hash_is_never_recorded() -> None:
    """public_url read the authority as a URL parser does: a token with an unescaped `/`, `?` or `#` ends it early,
    so `https://tok3n/s3cr3t@host/simple` was recorded as host `tok3n` and path `/s3cr3t@host/simple` (the token
    whole in the provenance), `https://tk?s3cr3t@host/simple` as `https://tk`; and the reader took them as plain.
    Everything up to the last `@` is userinfo now, as in every message (common.urls.shown_url)."""
    from buildtool.imagebuild.pipconfig import HostPip, package_indexes

    host = HostPip(index_url="https://tok3n/s3cr3t-A@pypi.example.invalid/simple",
                   extra_index_urls=("https://tk?s3cr3t-B@extra.example.invalid/simple",
                                     "https://user:ab#s3cr3t-C@third.example.invalid/simple"))
    found = package_indexes(host)
    assert "s3cr3t" not in json.dumps(found) and "tok3n" not in json.dumps(found), found
    assert found == [{"url": "https://pypi.example.invalid/simple", "role": "index-url"},
                     {"url": "https://extra.example.invalid/simple", "role": "extra-index-url"},
                     {"url": "https://third.example.invalid/simple", "role": "extra-index-url"}]
    with pytest.raises(ProvenanceError, match="packageIndexes URL is not a plain URL without credentials"):
        parse_provenance(body(packageIndexes=[{"url": "https://tok3n/s3cr3t@idx.example.invalid/simple",
                                               "role": "index-url"}]), "x")


def test_a_v2_provenance_is_still_read_and_v3_fields_under_v2_are_refused() -> None:
    from buildtool.attest.provenance_model import BUILD_TYPE_V2, ExternalParametersV2

    v2 = body()
    params = v2["buildDefinition"]["externalParameters"]
    for key in ("context", "createdEpoch", "packageIndexes"):
        del params[key]
    params["sourceDateEpoch"] = 1767225600
    v2["buildDefinition"]["buildType"] = BUILD_TYPE_V2
    assert isinstance(parse_provenance(v2, "x").buildDefinition.externalParameters, ExternalParametersV2)
    mixed = body()
    mixed["buildDefinition"]["buildType"] = BUILD_TYPE_V2
    with pytest.raises(ProvenanceError, match="externalParameters are not those of .*cell-build-v2"):
        parse_provenance(mixed, "x")
    missing = body()
    del missing["buildDefinition"]["externalParameters"]["createdEpoch"]
    with pytest.raises(ProvenanceError, match="malformed provenance"):
        parse_provenance(missing, "x")


def test_a_stand_in_base_is_stated_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, made = _made(tmp_path, monkeypatch, {**LABELS, label_keys.STANDIN: "true"})
    assert made.base is not None and made.base.annotations["standin"] is True


@pytest.mark.parametrize(("drop", "cause"), [
    (label_keys.OCI_BASE_DIGEST, "names no base by name and sha256 digest"),
    (label_keys.OCI_REVISION, "is not a full commit"),
])
def test_a_pushed_image_without_what_the_provenance_states_fails_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drop: str, cause: str) -> None:
    with pytest.raises(FailedError, match=cause):
        _made(tmp_path, monkeypatch, {k: v for k, v in LABELS.items() if k != drop})


# -- what the reader accepts ----------------------------------------------------------------------

def test_a_provenance_signed_by_an_untrusted_key_is_rejected() -> None:
    assert "untrusted key: signed by " + ATTACKER.keyid[:16] in read(provenance_envelope("r", D1, body(), ATTACKER))


def test_a_provenance_signed_by_a_key_trusted_only_as_tester_is_rejected_naming_the_role() -> None:
    why = read(provenance_envelope("r", D1, body()), keys=trusted(roles=("tester",)))
    assert isinstance(why, str) and "trusted as tester, not as builder" in why, why


def test_a_tampered_provenance_is_rejected() -> None:
    edited = tamper(provenance_envelope("r", D1, body()), {"runDetails": {"builder": {"id": "evil"}}})
    why = read(edited)
    assert isinstance(why, str) and why.startswith("wrongly signed: the signature of trusted key"), why


def test_a_provenance_replayed_from_another_digest_is_rejected() -> None:
    why = read(provenance_envelope("r", D2, body()), digest=D1)
    assert why == f"replayed: signed for {D2}, not for {D1}"


@pytest.mark.parametrize(("change", "cause"), [
    ({"extra": 1}, "malformed provenance: `extra`: Extra inputs are not permitted"),
    ({"buildDefinition": {}}, "malformed provenance: `buildDefinition.buildType`: Field required"),
])
def test_a_validly_signed_malformed_provenance_is_rejected_naming_the_field(change: dict, cause: str) -> None:
    why = read(provenance_envelope("r", D1, {**body(), **change}))
    assert isinstance(why, str) and cause in why, why


def test_a_verdict_signed_by_a_key_trusted_only_as_builder_does_not_count() -> None:
    """The tester role: a build job's key cannot vouch that an image passed (issue 25)."""
    why = _verify([Payload(DSSE, envelope("r", D1, verdict(CPU, D1)))], D1, trusted(roles=("builder",)), CPU.key)
    assert isinstance(why, str)
    assert why.startswith(f"signed by {KEY.keyid[:16]} (test runner), trusted as builder, not as tester"), why


# -- what release requires of a valid one -----------------------------------------------------------

def _gate(prov: dict, labels_digest: str = BASE_DIGEST, standins: StandIns | None = None) -> list[str]:
    platform = Platform("", D1, 1, {label_keys.OCI_BASE_DIGEST: labels_digest})
    return provenance_problems(CPU, D1, parse_provenance(prov, "test"), [platform], standins)


def test_a_valid_provenance_of_this_cell_on_the_labelled_base_passes() -> None:
    assert _gate(body()) == []


def test_a_provenance_naming_a_stand_in_base_is_refused() -> None:
    [why] = _gate(body(standin=True))
    assert why.startswith(f"the provenance of {D1} names a stand-in base (oci://{CPU.base}@{BASE_DIGEST})")


def test_a_provenance_whose_base_is_a_known_stand_in_digest_is_refused_whatever_it_says() -> None:
    standins = StandIns(digests={BASE_DIGEST: "127.0.0.1:5000/nvidia/pytorch:25.10-py3"})
    [why] = _gate(body(), standins=standins)
    assert why == (f"the provenance of {D1} names base {BASE_DIGEST}, the stand-in "
                   "127.0.0.1:5000/nvidia/pytorch:25.10-py3")


def test_a_provenance_of_another_base_or_cell_or_without_the_stand_in_flag_is_refused() -> None:
    other = "sha256:" + "e" * 64
    assert any(f"names base {BASE_DIGEST}, but the image's labels name {other}" in p for p in _gate(body(), other))
    assert _gate(body(cell="tensorflow-cpu:2.21")) == [
        f"the provenance of {D1} is for cell 'tensorflow-cpu:2.21', not {CPU.key}"]
    unflagged = body()
    unflagged["buildDefinition"]["resolvedDependencies"][0]["annotations"] = {}
    assert any("does not say whether its base is a stand-in" in p for p in _gate(unflagged))


# -- the revision: the release commit or its ancestor --------------------------------------------------

def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@example.org", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True, timeout=30).stdout.strip()


def test_only_a_committed_revision_that_is_the_release_commit_or_its_ancestor_may_be_released(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    first = _git(tmp_path, "rev-parse", "HEAD")
    _git(tmp_path, "checkout", "-q", "-b", "side")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "side")
    side = _git(tmp_path, "rev-parse", "HEAD")
    _git(tmp_path, "checkout", "-q", "main")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "two")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert revision_problem(tmp_path, head) == "" and revision_problem(tmp_path, first) == ""
    assert revision_problem(tmp_path, side) == (f"the provenance's revision {side[:12]} is neither the release "
                                                f"commit {head[:12]} nor an ancestor of it: release from a checkout "
                                                "that contains it")
    assert revision_problem(tmp_path, f"{head}-dirty.0123abcd").startswith(
        f"built from uncommitted changes (revision {head}-dirty.0123abcd)")
    unknown = "f" * 40
    assert revision_problem(tmp_path, unknown).startswith(
        f"the provenance's revision {unknown} is not a commit git knows in {tmp_path}")
    assert "is not a full commit" in revision_problem(tmp_path, head[:12])


def _timed(started: str, finished: str, revision: str = REV) -> dict:
    prov = provenance(CPU, revision=revision)  # type: ignore[arg-type]
    prov["runDetails"]["metadata"].update(startedOn=started, finishedOn=finished)
    return prov


@pytest.mark.parametrize(("started", "finished", "cause"), [
    ("2026-01-01T00:00:00Z", "later", "finishedOn 'later' is not an RFC 3339 time with its zone"),
    ("2026-01-01T00:00:00Z", "9999", "finishedOn '9999' is not an RFC 3339 time"),
    ("2026-01-01", "2026-01-01T00:01:00Z", "startedOn '2026-01-01' is not an RFC 3339 time"),
    ("2026-01-01T00:00:00Z", "2026-01-01T00:01:00", "finishedOn '2026-01-01T00:01:00' is not an RFC 3339 time"),
    ("2026-01-01T00:00:00Z", "2026-02-30T00:01:00Z", "finishedOn '2026-02-30T00:01:00Z' is not an RFC 3339 time"),
    ("2026-01-01T00:02:00Z", "2026-01-01T00:01:00Z", "the build finished (2026-01-01T00:01:00Z) before it started"),
])
def test_a_provenance_whose_build_times_are_no_rfc3339_times_is_refused(started: str, finished: str,
                                                                        cause: str) -> None:
    """The times order provenances (the one that finished last counts): text that is no time ("later", "9999")
    sorted after every real time and so won over every honest provenance of the digest."""
    why = read(provenance_envelope("r", D1, _timed(started, finished)))
    assert isinstance(why, str) and cause in why, why


def test_of_two_valid_provenances_the_one_that_finished_last_by_the_clock_counts_whatever_its_zone() -> None:
    from buildtool.attest.provenance_store import find_provenance
    from tests.memregistry import MemRegistry
    from tests.provenance_fixture import attest_provenance

    client = MemRegistry()
    digest = client.push_image("pytorch-cpu", "2.13-dev")
    older, newer = "b" * 40, "c" * 40
    # 01:00+02:00 is 23:00 UTC the day before: as text it sorts after 00:30Z, as a time it is earlier.
    attest_provenance(client, "pytorch-cpu", digest,  # type: ignore[arg-type]
                      predicate=_timed("2026-01-01T00:30:00+02:00", "2026-01-01T01:00:00+02:00", older))
    attest_provenance(client, "pytorch-cpu", digest,  # type: ignore[arg-type]
                      predicate=_timed("2026-01-01T00:00:00Z", "2026-01-01T00:30:00Z", newer))
    found = find_provenance(client, "pytorch-cpu", digest, trusted())   # type: ignore[arg-type]
    assert found.provenance is not None and not found.rejected, found.rejected
    assert found.provenance.buildDefinition.externalParameters.revision == newer


@pytest.mark.parametrize("kind", ["base", "source", "lock:"])
def test_a_provenance_naming_one_dependency_twice_is_refused(kind: str) -> None:
    """Release reads the first `base` (no stand-in, the labelled digest) while a second, a stand-in, sat unread
    beside it: one signed document saying two things, which a rebuilder or another verifier may read the other way."""
    prov = body()
    deps = prov["buildDefinition"]["resolvedDependencies"]
    first = next(d for d in deps if d["name"] == kind or d["name"].startswith(kind) and kind.endswith(":"))
    deps.append({**first, "annotations": {"standin": True}} if kind == "base" else dict(first))
    why = read(provenance_envelope("r", D1, prov))
    assert isinstance(why, str) and f"resolvedDependencies names {first['name']!r} more than once" in why, why
