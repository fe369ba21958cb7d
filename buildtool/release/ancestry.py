"""Whether the revision a provenance says an image was built from may be released from this checkout:
the release commit (HEAD of the clone release runs in) or an ancestor of it, committed, known to git; and
whether every other field of the provenance that names the source says the same (issue 48): the source's and
the tool's gitCommit (what SLSA verifiers read), each lock file's sha256 and the matrix's, against the files as
committed at that revision.

An image built from uncommitted changes, or from a branch the release commit does not contain, is
code nobody reviewed into what is released; a commit git does not know cannot be checked at all.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.attest.provenance_model import LOCK_PREFIX, Provenance
from buildtool.common.git_clone import refusal, shallow
from buildtool.contracts import label_keys
from buildtool.contracts.names import FULL_REVISION_RE, GIT_REVISION_RE
from buildtool.release.testcode import GIT_TIMEOUT_S, committed_sha256

if TYPE_CHECKING:
    from buildtool.matrix.plan import CellPlan


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                          check=False)


def revision_problem(root: Path, revision: str, release: str = "HEAD") -> str:
    """Why `revision` (a provenance's full revision) is not the release commit or its ancestor; "" when it is."""
    if not FULL_REVISION_RE.match(revision):
        return f"the provenance's revision {revision!r} is not a full commit (40 hex digits)"
    if "-dirty." in revision:
        return (f"built from uncommitted changes (revision {revision}): only committed work is released; "
                "commit, then build and validate again")
    head = _git(root, "rev-parse", "--verify", "--quiet", f"{release}^{{commit}}")
    if head.returncode != 0:
        return (refusal(root, head.stderr)
                or f"{root} has no release commit {release} to compare the provenance's revision with")
    known = _git(root, "cat-file", "-e", f"{revision}^{{commit}}")
    if known.returncode != 0:
        return (f"the provenance's revision {revision} is not a commit git knows in {root}; fetch it, or release "
                f"from the clone that holds it{shallow(root)}")
    ancestor = _git(root, "merge-base", "--is-ancestor", revision, head.stdout.strip())
    cut = shallow(root) if ancestor.returncode == 1 else ""
    if cut:   # the history between the two may be cut off: "not an ancestor" is not known
        return (f"whether the provenance's revision {revision[:12]} is an ancestor of the release commit "
                f"{head.stdout.strip()[:12]} cannot be told{cut}")
    if ancestor.returncode == 1:
        return (f"the provenance's revision {revision[:12]} is neither the release commit {head.stdout.strip()[:12]} "
                "nor an ancestor of it: release from a checkout that contains it")
    if ancestor.returncode != 0:
        return f"git merge-base --is-ancestor {revision[:12]} failed: {ancestor.stderr.strip()[:200]}"
    return ""


def tag_revision_problem(tag_revision: str, revision: str) -> str:
    """Why the provenance's full `revision` is not the revision the dev tag names (`tag_revision`: a sha, most often
    the 12-digit prefix builds tag with, compared as a prefix then); "" when it is, and when the tag names no commit
    (a revision a pipeline named itself, `nightly-42`: nothing to compare)."""
    match = GIT_REVISION_RE.match(tag_revision)
    if match is None:
        return ""
    sha, dirty = match.group("sha"), match.group("dirty") or ""
    built, sep, built_dirty = revision.partition("-dirty.")
    if built.startswith(sha) and len(built) == 40 and built_dirty == dirty:
        return ""
    prefix = f" (the tag holds the first {len(sha)} hex digits of a commit, compared as a prefix)" \
        if len(sha) < 40 else ""
    return (f"the dev tag names revision {tag_revision}, but the signed provenance says the image was built from "
            f"{built[:12]}{sep}{built_dirty}{prefix}: an image of another commit was put at this dev tag; build and "
            "push this commit's image, or release the commit it was built from")


def retag_problem(root: Path, plan: CellPlan, revision: str, labels: Mapping[str, str], platform: str | None) -> str:
    """Why the image built at `revision` (B; its config's `labels`) at the dev tag of plan.revision (A) is not the
    image `buildtool build` retags there for an unchanged cell (builder._registry_match); "" when it is: its content
    key label is the key the cell has at A, which must be this checkout's HEAD (cell_inputs.cell_content_key, as the
    builder compared it: on the base digest the image records, of `platform`'s image for a multi-platform cell)."""
    from buildtool.contracts.image_labels import ImageLabels, LabelError
    from buildtool.imagebuild.cell_inputs import BaseInfo, cell_content_key

    tag = plan.revision
    head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").stdout.strip()
    if "-dirty." in tag or not head or not head.startswith(tag.lower()):
        return (f"that cannot be confirmed from this checkout: it needs the cell's content key at {tag}, and the "
                f"checkout's HEAD is {head[:12] or 'no commit'}; release (or verify) from a clone of {tag}")
    try:
        parsed = ImageLabels.parse(labels)
    except LabelError as exc:
        return f"its labels do not parse ({exc}), so its content key cannot be compared"
    if not parsed.content_key or not parsed.base_digest:
        missing = label_keys.CONTENT_KEY if not parsed.content_key else label_keys.OCI_BASE_DIGEST
        return f"it has no label {missing}, so its content key cannot be compared with the cell's at {tag}"
    try:
        # The build machine's base is in the key of an image whose label names it (cell_inputs.cell_content_key).
        build = BaseInfo(plan.base, parsed.build_base_digest) if parsed.build_base_digest else None
        key = cell_content_key(plan, root, BaseInfo(plan.base, parsed.base_digest, build=build), platform)
    except OSError as exc:
        return f"the cell's content key at {tag} cannot be computed in {root}: {exc}"
    if key != parsed.content_key:
        return (f"its content key {parsed.content_key} is not the cell's at {tag} ({key}): the cell changed between "
                f"{revision[:12]} and {tag}")
    return ""


def source_problems(root: Path, provenance: Provenance, matrix_name: str = "matrix.yaml") -> list[str]:
    """Why the provenance may not be released from this checkout (empty: it may): its revision
    (revision_problem), then each field that names the source against git at that revision."""
    revision = provenance.buildDefinition.externalParameters.revision
    why = revision_problem(root, revision)
    if why:
        return [why]
    problems = []
    for descriptor in (provenance.source, *provenance.tools):
        if descriptor is None or "gitCommit" not in descriptor.digest:
            continue
        named = descriptor.digest["gitCommit"]
        if named != revision:
            problems.append(f"the provenance's {descriptor.name} names gitCommit {named}, not its revision "
                            f"{revision}: what SLSA verifiers read must be what was built")
    matrix = provenance.buildDefinition.externalParameters.matrix_digest
    committed = committed_sha256(root, revision, matrix_name)
    if committed is None or matrix != f"sha256:{committed}":
        problems.append(f"the provenance's matrix_digest {matrix} is not {matrix_name} as committed at {revision[:12]} "
                        f"({'none there' if committed is None else 'sha256:' + committed})")
    for lock in provenance.locks:
        path = lock.name.removeprefix(LOCK_PREFIX)
        committed = committed_sha256(root, revision, path)
        if committed is None:
            problems.append(f"the provenance's {lock.name}: no such file committed at {revision[:12]}")
        elif lock.digest.get("sha256") != committed:
            problems.append(f"the provenance's {lock.name} sha256:{lock.digest.get('sha256', '?')} is not that file as "
                            f"committed at {revision[:12]} (sha256:{committed})")
    return problems
