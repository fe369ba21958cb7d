"""Signed verdicts for the toolkit's own tests: a test key, verdicts (the current schema, or the one
before it), attestations.

A real `buildtool validate` signs with the runner's key; here verdicts are made by hand (what
an image test run would record) and signed with a key made for the test session, or with an
attacker's key, or not at all, to show what release does with each.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any

from buildtool.attest.dsse import PrivateKey, generate, sign_envelope
from buildtool.attest.keys import SigningKey, TrustedKeys
from buildtool.attest.referrers import Payload, Referrer, attach
from buildtool.attest.verdict_statement import DSSE_MEDIA_TYPE, PAYLOAD_TYPE, statement
from buildtool.contracts.names import ATTESTATION_TYPE
from buildtool.contracts.verdict import SCHEMA, VerdictError, parse_verdict
from buildtool.matrix.schema import Cell
from buildtool.registry.client import RegistryClient
from buildtool.release.testcode import KnownCode

KEY = generate()            # the trusted runner's key, for this test session
CODE = "sha256:" + "0" * 64     # the image-tests code hash of the verdicts made here
ATTACKER = generate()       # a key nobody trusts
SBOM = "sha256:" + "5" * 64     # an SBOM digest for verdicts about no image in particular
MATRIX = "sha256:" + "c" * 64   # the matrix the verdicts made here read (and the provenance names)


def trusted(*keys: PrivateKey, roles: tuple[str, ...] = ("builder", "tester")) -> TrustedKeys:
    """The trusted keys release reads, holding `keys` (default: KEY) in `roles`."""
    found = TrustedKeys(source="config/trusted-keys.yaml")
    for key in keys or (KEY,):
        public = key.public()
        found.keys[public.keyid] = public
        found.names[public.keyid] = "test runner"
        found.roles[public.keyid] = frozenset(roles)
    return found


def known_code(*codes: str, matrix: str = MATRIX) -> KnownCode:
    """Release's view of which image-tests code (and matrix) verdicts may have run (buildtool.release.testcode),
    as if `CODE` were image-tests at the image's revision; no folder: nothing to collect from."""
    return KnownCode({code: (f"image-tests at the image's revision ({code[7:19]})", None) for code in codes or (CODE,)},
                     [f"the image's revision abc: {code}" for code in codes or (CODE,)],
                     {matrix: "matrix.yaml at the image's revision abc"})


def result(id_: str, outcome: str = "passed", code: str = "", text: str = "", gpu: bool = False,
           subject: str = "") -> dict[str, Any]:
    return {"id": id_, "group": id_.split("/", 1)[0], "result": outcome, "duration_s": 0.1, "message": "",
            "skip_code": code, "skip_subject": subject, "skip_reason": text, "gpu": gpu}


def verdict(cell: Cell, digest: str, outcome: str = "passed", /, tests: list[dict[str, Any]] | None = None,
            started: str = "2026-01-01T00:00:00.000+00:00", **changes: Any) -> dict[str, Any]:
    """A verdict (schema SCHEMA; `schema=5` for the one before) that covers the cell's groups: every
    test listed is a defined test. It names the SBOM `attest_sbom` attaches by default (the digest of
    minimal_sbom(digest)) unless `sbom`/`sbom_problem` say otherwise, and (schema 6) the matrix MATRIX and the
    cell's library promises."""
    from buildtool.sbom.signing import sbom_digest

    tests = tests if tests is not None else [result(f"{g}/test_x.py::test_{g}") for g in cell.tests]
    body = {"schema": SCHEMA, "digest": digest, "image": f"x@{digest}", "cell": cell.key, "result": outcome,
            "started": started, "duration_s": 1.0, "test_code": CODE,
            "runner": {"hostname": "ci", "gpu_runner": False, "gpus": [], "driver": "", "cuda_driver": "",
                       "gpu_problem": ""},
            "groups": list(cell.tests), "defined_tests": [t["id"] for t in tests],
            "selection": {"expression": None, "deselected": []}, "run_flags": [], "pytest_exit": 0,
            "tests": tests, "figures": {}, "sbom": sbom_digest(minimal_sbom(digest)), "platform": "linux/amd64",
            "emulated": False, "matrix_digest": MATRIX, "libraries": promised(cell)}
    body.update(changes)
    older = {5: ("matrix_digest", "libraries"), 4: ("matrix_digest", "libraries", "platform", "emulated")}
    for field in older.get(body["schema"], ()):
        if field not in changes:
            body.pop(field)     # an older schema has no such field
    return body


def promised(cell: Cell) -> dict[str, str]:
    """The cell's NVIDIA library promises as a verdict records them (schema 6)."""
    return {} if cell.libraries is None else {"cudnn": cell.libraries.cudnn, "nccl": cell.libraries.nccl}


def complete(body: dict[str, Any]) -> dict[str, Any]:
    """A verdict with only what a test cares about given: every other required field filled in with a
    neutral value (the current schema unless given, a runner `ci`, each test's group from its id)."""
    tests = [{"group": str(t.get("id", "")).split("/", 1)[0], **t} for t in body.get("tests", [])]
    schema = body.get("schema", SCHEMA)
    sbom = {"sbom": SBOM} if "sbom_problem" not in body else {}
    platform = {**({"platform": "linux/amd64"} if schema >= 5 else {}), **({"matrix_digest": MATRIX} if schema >= 6
                                                                            else {})}
    return {"schema": SCHEMA, **platform, "digest": "sha256:" + "0" * 64, "image": "", "cell": "", "result": "passed",
            "started": "2026-01-01T00:00:00.000+00:00", "duration_s": 1.0, "test_code": CODE, "groups": [],
            "defined_tests": [t["id"] for t in tests if "id" in t], "pytest_exit": 0, **sbom, **body,
            "runner": {"hostname": "ci", **body.get("runner", {})}, "tests": tests}


def envelope(repo_name: str, digest: str, body: dict[str, Any], key: PrivateKey = KEY) -> bytes:
    return json.dumps(sign_envelope(key, PAYLOAD_TYPE, statement(repo_name, digest, body)), sort_keys=True).encode()


def attest(client: RegistryClient, repo: str, digest: str, body: dict[str, Any], key: PrivateKey = KEY) -> Referrer:
    """Sign and attach as validate does; a body that does not parse as a verdict (a test of what
    release refuses) is signed and attached as it is, the same way."""
    from buildtool.validate.verdicts import attest as real_attest
    from buildtool.validate.verdicts import pin

    try:
        typed = parse_verdict(body, "test verdict")
    except VerdictError:
        referrer = attach_raw(client, repo, digest, envelope(f"{client.host}/{repo}", digest, body, key))
        pin(client, repo, digest, referrer.digest)
        return referrer
    return real_attest(client, repo, digest, typed, SigningKey(key, "test key", dev=False))


def attach_raw(client: RegistryClient, repo: str, digest: str, data: bytes,
               artifact_type: str = ATTESTATION_TYPE, media_type: str = DSSE_MEDIA_TYPE) -> Referrer:
    """Attach any bytes as a referrer of `digest`, as anyone with push access can (ORAS-style)."""
    return attach(client, repo, digest, artifact_type, [Payload(media_type, data, "verdict")])


def tamper(data: bytes, change: dict[str, Any]) -> bytes:
    """The envelope with its statement's predicate changed and the old signature kept."""
    env = json.loads(data)
    body = json.loads(base64.b64decode(env["payload"]))
    body["predicate"].update(change)
    env["payload"] = base64.b64encode(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).decode()
    return json.dumps(env, sort_keys=True).encode()


# -- provenance (issue 25) ------------------------------------------------------------------------

BASE_DIGEST = "sha256:" + "b" * 64     # the base the test images' labels name (label_keys.OCI_BASE_DIGEST)


@functools.lru_cache(maxsize=1)
def head_commit() -> str:
    """This checkout's HEAD, in full: a revision release may take (the release commit itself)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def provenance(cell: Cell, /, *, base_digest: str = BASE_DIGEST, standin: bool = False, revision: str = "",
               root: Path | None = None, **params: Any) -> dict[str, Any]:
    """A provenance predicate as a push writes it for `cell` (buildtool.imagebuild.provenance), built at
    `revision` (default: this checkout's HEAD, with the matrix and the cell's locks as committed there; `root`: the
    repository of `revision`, default this one) on `base_digest`; `params` override external parameters."""
    import subprocess

    from buildtool.attest.provenance_model import BASE, BUILD_TYPE

    revision = revision or head_commit()
    committed = revision.partition("-dirty.")[0]
    try:
        committed_sha256("matrix.yaml", committed, root)
    except subprocess.CalledProcessError:
        committed = "HEAD"      # a revision git does not know (a test of its refusal): HEAD's sources
    external = {"cell": cell.key, "matrix_digest": committed_matrix(root, committed), "revision": revision,
                "source": "https://example.invalid/dl-images", "dockerfile": cell.dockerfile,
                "context": str(Path(cell.dockerfile).parent),
                "platform": "linux/amd64", "buildArgs": {"BASE_IMAGE": f"{cell.base}@{base_digest}"},
                "sourceDateEpoch": 0, "createdEpoch": 1767225600, "secrets": ["pip.conf", "uv.toml"],
                "network": "host", "packageIndexes": [{"url": "https://pypi.org/simple", "role": "index-url"}],
                **params}
    commit = str(external["revision"]).partition("-dirty.")[0]
    return {"buildDefinition": {
                "buildType": BUILD_TYPE, "externalParameters": external, "internalParameters": {},
                "resolvedDependencies": [
                    {"name": BASE, "uri": f"oci://{cell.base}", "digest": {"sha256": base_digest.partition(":")[2]},
                     "annotations": {"standin": standin}},
                    {"name": "source", "uri": f"git+https://example.invalid/dl-images@{commit}",
                     "digest": {"gitCommit": commit}},
                    *committed_locks(cell, root, committed),
                    {"name": "tool:buildtool", "uri": f"git+https://example.invalid/dl-images@{commit}",
                     "digest": {"gitCommit": commit}, "annotations": {"version": "0.1.0"}}]},
            "runDetails": {"builder": {"id": "https://ci.example.invalid/runs/1", "version": {"buildtool": "0.1.0"}},
                           "metadata": {"invocationId": "1", "startedOn": "2026-01-01T00:00:00Z",
                                        "finishedOn": "2026-01-01T00:01:00Z"}}}


def provenance_envelope(repo_name: str, digest: str, body: dict[str, Any], key: PrivateKey = KEY) -> bytes:
    from buildtool.attest import intoto
    from buildtool.attest.provenance_model import PREDICATE_TYPE

    payload = intoto.statement(repo_name, digest, PREDICATE_TYPE, body)
    return json.dumps(sign_envelope(key, intoto.PAYLOAD_TYPE, payload), sort_keys=True).encode()


def attach_provenance(client: RegistryClient, repo: str, digest: str, body: dict[str, Any],
                      key: PrivateKey = KEY) -> Referrer:
    """Sign `body` with `key` and attach it as a push does (a body that does not parse is attached as it is)."""
    from buildtool.contracts.names import PROVENANCE_TYPE

    data = provenance_envelope(f"{client.host}/{repo}", digest, body, key)
    return attach_raw(client, repo, digest, data, artifact_type=PROVENANCE_TYPE)


def source_check() -> Any:
    """Release's check of a provenance's revision and the sources it names, in this checkout
    (buildtool.release.ancestry)."""
    from functools import partial
    from pathlib import Path

    from buildtool.release.ancestry import source_problems

    return partial(source_problems, Path(__file__).resolve().parents[1])


def retag_check() -> Any:
    """Release's check that an image whose provenance names another commit than its dev tag is `buildtool build`'s
    retag there, in this checkout (buildtool.release.ancestry.retag_problem): what verify runs with a checkout here."""
    from functools import partial
    from pathlib import Path

    from buildtool.release.ancestry import retag_problem

    return partial(retag_problem, Path(__file__).resolve().parents[1])


@functools.cache
def committed_sha256(path: str, revision: str = "HEAD", root: Path | None = None) -> str:
    """sha256 (hex) of a file as committed at `revision` in `root` (default: this repository)."""
    import hashlib
    import subprocess

    where = root or Path(__file__).resolve().parents[1]
    shown = subprocess.run(["git", "-C", str(where), "show", f"{revision}:{path}"], capture_output=True, check=True,
                           timeout=60).stdout
    return hashlib.sha256(shown).hexdigest()


def committed_matrix(root: Path | None = None, revision: str = "HEAD") -> str:
    """The digest of matrix.yaml as committed at `revision` in `root`: what a provenance built there names, and
    what a verdict validated with that matrix records."""
    return "sha256:" + committed_sha256("matrix.yaml", revision, root)


def committed_locks(cell: Cell, root: Path | None = None, revision: str = "HEAD") -> list[dict[str, Any]]:
    """The cell's lock files as committed at `revision` in `root`, as the provenance's resolved dependencies name
    them (none for the multi-platform variants tests make of single-platform cells: no such locks are committed)."""
    import subprocess

    from buildtool.imagebuild.lock import lock_paths

    where = root or Path(__file__).resolve().parents[1]
    found: list[dict[str, Any]] = []
    if cell.multi_platform:
        return found
    for path in lock_paths(where, cell).values():
        rel = str(path.relative_to(where))
        try:
            found.append({"name": f"lock:{rel}", "digest": {"sha256": committed_sha256(rel, revision, root)}})
        except subprocess.CalledProcessError:
            continue    # the fixture matrix's cell lays its locks out otherwise than the committed one
    return found


# -- the builder's SBOM attestation -----------------------------------------------------------------

def minimal_sbom(digest: str, components: int = 2) -> dict[str, Any]:
    """A small CycloneDX 1.6 document about `digest` (what push makes, cut down to what readers check)."""
    return {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
            "metadata": {"component": {"type": "container", "name": "x", "version": digest, "bom-ref": digest}},
            "components": [{"type": "library", "name": f"p{i}", "version": "1.0", "bom-ref": f"pkg:pypi/p{i}@1.0",
                            "purl": f"pkg:pypi/p{i}@1.0"} for i in range(components)]}


def attest_sbom(client: RegistryClient, repo: str, digest: str, document: dict[str, Any] | None = None,
                key: PrivateKey = KEY, plain: bool = True) -> str:
    """Attach the SBOM as push does (plain, and signed by `key` as builder); returns the SBOM's digest."""
    from buildtool.sbom.document import store_sbom
    from buildtool.sbom.signing import attest_sbom as real_attest_sbom
    from buildtool.sbom.signing import sbom_digest

    document = document if document is not None else minimal_sbom(digest)
    if plain:
        store_sbom(client, repo, digest, document)
    real_attest_sbom(client, repo, digest, document, key)
    return sbom_digest(document)
