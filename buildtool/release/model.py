"""What a release is made of: the options, each image's promotion (gate results, tag plan,
what happened) and the report. Data only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from buildtool.attest.keys import TrustedKeys
from buildtool.attest.provenance_model import Provenance
from buildtool.attest.referrers import Referrer
from buildtool.contracts.verdict import Verdict
from buildtool.release.gates import Platform
from buildtool.release.testcode import CodeBook, KnownCode

if TYPE_CHECKING:
    from buildtool.matrix.plan import CellPlan


@dataclass
class TagAction:
    tag: str
    moving: bool
    current: str | None          # digest the tag points at now (None: absent)
    action: str = ""             # create | exists | move | keep | refuse
    note: str = ""


@dataclass
class Evidence:
    """What release found for one platform manifest's digest (the manifest itself for a single-platform
    image): its counting verdict, signed provenance and signed SBOM. Each platform of an index is gated on
    its own evidence: a verdict, an SBOM or a provenance belongs to exactly one digest."""

    digest: str
    platform: str = ""           # os/arch of an index entry; "" for a single manifest (the cell's only platform)
    verdict: Verdict | None = None    # the counting verdict, typed (parsed where it was read)
    verdict_ref: str = ""        # <dev repo>@<attestation digest>
    attestation: Referrer | None = None
    signer: str = ""             # key id (and name) that signed the verdict
    provenance: Provenance | None = None      # the valid provenance, from a trusted builder key
    provenance_artifact: Referrer | None = None
    builder_signer: str = ""     # key id (and name) that signed the provenance
    sbom_attestation: Referrer | None = None   # the signed SBOM the verdict names (release.sbomgate)
    skips: list[dict[str, Any]] = field(default_factory=list)   # each skipped test and what accepted it
    notes: list[str] = field(default_factory=list)      # facts worth a line in the release notes
    ignored: list[str] = field(default_factory=list)    # its attestations that did not verify, and why
    problems: list[str] = field(default_factory=list)   # why this platform may not be released


@dataclass
class ImageRelease:
    """One cell's promotion: gate results, tag plan and what happened."""

    cell: str
    image: str
    source: str                  # dev ref
    release_repo: str
    digest: str = ""
    media_type: str = ""
    platforms: list[Platform] = field(default_factory=list)
    # One per platform manifest, in the index's order (one for a single manifest); see Evidence.
    evidence: list[Evidence] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)    # attestations that did not verify, and why
    notes: list[str] = field(default_factory=list)      # facts worth a line in the release notes
    tags: list[TagAction] = field(default_factory=list)
    status: str = "pending"      # refused | ready | promoted | unchanged | failed | not attempted | dry-run
    problems: list[str] = field(default_factory=list)
    tags_made: list[str] = field(default_factory=list)
    # After a failure, tags whose write got no answer and that could not be read back: unknown.
    tags_unknown: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)   # moving tags put back by the final re-check
    # What moving the blobs took or may take: mounts the registry declined (blobs uploaded through this machine)
    # or, in a dry run, may decline (release.tag_plan.mount_outlook).
    transfer: list[str] = field(default_factory=list)
    previous: dict[str, Any] | None = None
    # SBOM and package changes (release.package_changes): one section, or {"platforms": [...]} for an index.
    packages: dict[str, Any] | None = None
    _raw: bytes = b""

    @property
    def size(self) -> int:
        return sum(p.size for p in self.platforms)

    @property
    def labels(self) -> dict[str, str]:
        return self.platforms[0].labels if self.platforms else {}


@dataclass
class ReleaseReport:
    version: str
    revision: str
    images: list[ImageRelease]
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return all(i.status in ("promoted", "unchanged", "dry-run") for i in self.images)

    @property
    def refused(self) -> list[ImageRelease]:
        return [i for i in self.images if i.status == "refused"]


@dataclass
class ReleaseOptions:
    version: str
    revision: str
    force: bool = False
    dry_run: bool = False
    lock_wait_s: float = 60.0
    lock_ttl_s: float = 300.0
    accept_skips: tuple[str, ...] = ()      # --accept-skip regexes: explicit, recorded waivers
    lock_settle_s: float | None = None     # None: adaptive, 5 lock-write round trips (at least 20 ms)
    # Keys whose verdicts count (none: nothing passes); a Future when they are still being read
    # (buildtool.cli.release_run reads them while the first registry requests are on their way).
    trusted: TrustedKeys | Future[TrustedKeys] = field(default_factory=TrustedKeys)
    # The image-tests code a verdict may have run (buildtool.release.testcode: image-tests as committed
    # at the image's revision and at the release commit); None: nothing to compare with, so no verdict counts.
    # A CodeBook answers for the revision each image's signed provenance names; a KnownCode (the toolkit's tests)
    # is the same for every image.
    known_code: CodeBook | KnownCode | Future[CodeBook] | Future[KnownCode] | None = None
    # Why a provenance may not be released (empty when it may: its revision is the release commit or an ancestor
    # of it, and every field naming the source is what git holds there; buildtool.release.ancestry.source_problems
    # in the checkout release runs in). None: nothing to check against, so no provenance counts.
    source_check: Callable[[Provenance], list[str]] | None = None
    # Why an image whose provenance names another commit than its dev tag is not `buildtool build`'s retag of an
    # unchanged cell there ("" when it is; buildtool.release.ancestry.retag_problem in that checkout): (plan, the
    # provenance's revision, the image's labels, its platform for a multi-platform cell). None: none is accepted.
    retag_check: Callable[[CellPlan, str, Mapping[str, str], str | None], str] | None = None

    def trusted_keys(self) -> TrustedKeys:
        return self.trusted.result() if isinstance(self.trusted, Future) else self.trusted

    def test_code(self, revision: str | None = None) -> KnownCode | None:
        """The code a verdict of an image may have run; `revision`: the one its signed provenance names (None:
        no valid provenance names one)."""
        known = self.known_code.result() if isinstance(self.known_code, Future) else self.known_code
        return known.at(revision) if isinstance(known, CodeBook) else known


@dataclass
class TagState:
    current: dict[str, str | None]
    tags: list[str]
    previous: dict[str, Any] | None = None
