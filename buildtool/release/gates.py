"""What must hold before a digest is released as a cell: pure checks on what release read (the version, the
verdict, the image's labels and base, the signed provenance, an index's platforms, each platform manifest on its
own evidence). Each check, and why, is in docs/release-trust.md ("What release checks").

No waiver covers anything but waivable skips.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from buildtool.attest.provenance_model import Provenance, pinned_reference
from buildtool.common.errors import UserError
from buildtool.common.refs import names_mirror_of
from buildtool.contracts import label_keys, names, platforms, skips
from buildtool.contracts.image_labels import ImageLabels, LabelError
from buildtool.contracts.verdict import TestResult, Verdict, recorded_failure
from buildtool.validate.verdict_choice import gpus_text, inventory_problems, one_gpu_skips

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

# -- versions ------------------------------------------------------------------------------------

def check_version(version: str) -> str:
    """The release version in PEP 440's normal form (`v1.0` -> `1.0`, `1.0-RC1` -> `1.0rc1`); it must
    order and be usable inside a tag. Equal versions spelt differently (`1.0`, `1.0.0`) are caught
    against what is already released (`spelling_problems`)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise UserError(f"--version {version!r} is not a version like 0.1.0") from None
    normal = str(parsed)
    if not names.TAG_RE.match(normal):
        raise UserError(f"--version {version!r} cannot be part of a tag; use letters, digits, '.', '-', '_'")
    return normal


def spelling_problems(version: str, released: dict[Version, str], what: str) -> list[str]:
    """A version equal by PEP 440 to a released one but spelt otherwise (1.0 vs 1.0.0) is refused:
    one release, one spelling. `released`: version -> where it is (a tag, a release file)."""
    wanted = Version(version)
    for number, where in released.items():
        if number == wanted and str(number) != version:
            return [f"release {version} of {what} already exists as {where} ({number} and {version} are the "
                    f"same PEP 440 version); use --version {number}, or a new version"]
    return []


# -- the verdict ---------------------------------------------------------------------------------

def marked_gpu(test: TestResult, local_tests: dict[str, bool] | None = None) -> bool:
    """Whether a test is marked gpu: this checkout's collection says so when it knows the test
    (a verdict cannot promote a gloo test to a GPU test), else the verdict's own flag."""
    if local_tests is not None and test.id in local_tests:
        return local_tests[test.id]
    return test.gpu


def skip_judgement(cell: Cell, test: TestResult, local_tests: dict[str, bool] | None = None) -> skips.Judgement:
    """What the matrix says of a skipped test (buildtool.contracts.skips): its code's rule, checked
    against this cell and this test (a code only some tests may carry); the skip's prose is never read."""
    return skips.judge(cell, test.skip_code, test.skip_subject, test.id, marked_gpu(test, local_tests))


def skip_allowed(cell: Cell, test: TestResult, local_tests: dict[str, bool] | None = None) -> bool:
    """A skipped test is acceptable only where the matrix says it cannot run on this cell (e.g.
    a GPU check on a cell with `run.gpus: none`), and only with a code that test may carry."""
    return skip_judgement(cell, test, local_tests) == "expected"


def waiver_for(cell: Cell, test: TestResult, accept: tuple[str, ...],
               local_tests: dict[str, bool] | None = None) -> str | None:
    """The `--accept-skip CODE[:SUBJECT]` that waives this skip, if any: only codes the contract marks
    waivable (a runner's limits), matched by name (skips.waives: never against the skip's prose), never a
    GPU check of a GPU cell."""
    if skip_judgement(cell, test, local_tests) != "waivable":
        return None
    return next((waiver for waiver in accept if skips.waives(waiver, test.skip_code, test.skip_subject)), None)


def is_gpu_cell(cell: Cell) -> bool:
    return cell.needs_gpu or cell.run.gpus != "none"


def _listed(ids: Iterable[str], limit: int = 3, sep: str = ", ", sort: bool = True) -> str:
    ids = sorted(ids) if sort else list(ids)
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return sep.join(ids[:limit]) + more


def verdict_problems(cell: Cell, digest: str, verdict: Verdict | None, accept: tuple[str, ...] = (),
                     local_tests: dict[str, bool] | None = None, covered: dict[str, str] | None = None,
                     companion_why: tuple[str, ...] = ()) -> list[str]:
    """Why a verdict does not let `digest` be released as `cell` (empty: it does).

    The verdict must have run every test group the matrix gives the cell (`cell.tests`, never a list
    filtered by what some checkout holds); `local_tests`: id -> gpu of what this checkout's image-tests
    define for the cell, given when the verdict ran this checkout's test code. The verdict is typed
    (parsed where it entered, buildtool.contracts.verdict.parse_verdict): what does not parse never
    gets here. `covered`: tests this verdict skipped as one-gpu-on-runner that a trusted multi-GPU verdict of
    the same digest passed (validate.verdict_choice; id -> where), which count as passed; `companion_why`: why no
    other verdict covered them."""
    covered = covered or {}
    if verdict is None:
        return [f"{digest} has no verdict in the registry; run `make validate FRAMEWORK={cell.key}` first"]
    problems = []
    if verdict.cell != cell.key:
        problems.append(f"verdict of {digest} is for cell {verdict.cell!r}, not {cell.key}")
    if verdict.digest != digest:
        problems.append(f"verdict names digest {verdict.digest}, not {digest}")
    tests = verdict.tests
    result: str = verdict.result
    reasons = list(verdict.incomplete)
    if covered and result == "incomplete":
        result, reasons = with_covered(verdict, covered)
    if result != "passed":
        failed = [t.id for t in tests if t.result == "failed"]
        problems.append(f"verdict of {digest} is {result!r}"
                        + (f" (failed: {_listed(failed)})" if failed else "")
                        + (f": {'; '.join(reasons)}" if covered and reasons else ""))
    contradiction = recorded_failure(verdict)
    if contradiction:
        # The signed summary never outvotes the signed results: the report shows such a verdict failed too.
        problems.append(f"verdict of {digest} contradicts itself: {contradiction}; validate the image again")
    if not any(t.result == "passed" for t in tests):
        problems.append(f"verdict of {digest} has no passed test")
    problems += _coverage_problems(cell, verdict, local_tests)
    if is_gpu_cell(cell):
        gpu_ids = {t.id for t in tests if t.gpu} | {i for i, gpu in (local_tests or {}).items() if gpu}
        results = {t.id: t.result for t in tests}
        one_gpu = set(one_gpu_skips(verdict))
        not_passed = sorted(i for i in gpu_ids if results.get(i) != "passed" and i not in one_gpu)
        missing = sorted(i for i in one_gpu if i not in covered)
        if missing:
            problems.append(_one_gpu_missing(cell, verdict, missing, companion_why))
        if not_passed:
            problems.append(f"{len(not_passed)} GPU test(s) of GPU cell {cell.key} did not pass: "
                            f"{_listed(not_passed)}; validate on a GPU runner (no waiver covers them)")
        problems += inventory_problems(verdict)
    skipped = [t for t in tests if t.result == "skipped"]
    misplaced = [why for t in skipped
                 if (why := skips.misplaced(t.skip_code, t.id, marked_gpu(t, local_tests))) is not None]
    if misplaced:
        problems.append(f"{len(misplaced)} skip code(s) on tests that may not carry them: "
                        f"{_listed(misplaced, sep='; ', sort=False)}; no waiver covers this: validate again with this "
                        "checkout's image-tests")
    bad_skips = [t for t in skipped if skips.misplaced(t.skip_code, t.id, marked_gpu(t, local_tests)) is None
                 and not skip_allowed(cell, t, local_tests) and waiver_for(cell, t, accept, local_tests) is None
                 and not (is_gpu_cell(cell) and t.skip_code == skips.ONE_GPU_ON_RUNNER.code)]   # said above
    if bad_skips:
        shown = _listed([f"{t.id} ({t.skip_reason or 'no reason'})" for t in bad_skips], sort=False)
        # --accept-skip is suggested only where it can help: a code the contract marks waivable (a runner limit).
        waivable = sorted({t.skip_code for t in bad_skips if skip_judgement(cell, t, local_tests) == "waivable"})
        flags = " ".join(f"--accept-skip {code}" for code in waivable)
        hint = (f" (or waive the runner's limit: pass {flags})" if waivable
                else "; no --accept-skip waives these codes")
        problems.append(f"{len(bad_skips)} test(s) skipped where the matrix expects them to run: {shown}; "
                        f"validate on a runner that can run them{hint}")
    return problems


def with_covered(verdict: Verdict, covered: dict[str, str]) -> tuple[str, list[str]]:
    """The verdict's result had the covered tests passed: the same rule validate applied (derive_result)."""
    from buildtool.contracts.verdict import derive_result

    tests = [{"id": t.id, "result": "passed" if t.id in covered else t.result} for t in verdict.tests]
    return derive_result(verdict.pytest_exit, tests, defined=verdict.defined_tests, selection=verdict.selection,
                         gpu_cell=True, gpu_tests=verdict.gpu_tests or [t.id for t in verdict.tests if t.gpu],
                         emulated=verdict.emulated)


def binding_problems(cell: Cell, verdict: Verdict, matrices: dict[str, str]) -> list[str]:
    """What the verdict was bound to (schema 6) must be what release releases: the library promises it checked
    are the matrix cell's now, and the matrix it read is the one committed at the image's revision or the release
    commit (`matrices`: sha256 -> where). An older verdict does not say: it is refused."""
    if verdict.schema_ < 6:
        return [f"the verdict is schema {verdict.schema_}: it does not record the matrix and library promises it "
                "checked (schema 6); validate the image again"]
    problems = []
    promised = {} if cell.libraries is None else {"cudnn": cell.libraries.cudnn, "nccl": cell.libraries.nccl}
    if verdict.libraries != promised:
        def shown(libs: dict[str, str]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(libs.items())) or "none"
        problems.append(f"the verdict checked the library promises {shown(verdict.libraries)}, but the matrix promises "
                        f"{shown(promised)} for {cell.key} now: validate the image again (the catalogue states what "
                        "the matrix promises)")
    if verdict.matrix_digest not in matrices:
        where = "; ".join(f"{d} ({w})" for d, w in matrices.items()) or "no committed matrix found"
        problems.append(f"the verdict ran with the matrix {verdict.matrix_digest}, which is not the matrix committed "
                        f"at the image's revision or the release commit ({where}): its expectations may not be the "
                        "ones released; validate with the committed matrix")
    return problems


def _one_gpu_missing(cell: Cell, verdict: Verdict, missing: list[str], why: tuple[str, ...]) -> str:
    """What releases a one-GPU runner's verdict, exactly: the multi-GPU verdict it lacks."""
    runner = gpus_text(verdict)
    platform = verdict.platform or "its platform"
    found = f" ({'; '.join(why)})" if why else " (there is none)"
    select = shlex.quote(" or ".join(i.rsplit("::", 1)[-1] for i in missing))   # several: one shell word
    return (f"{_listed(missing)} skipped as one-gpu-on-runner on {runner}: release also needs a trusted verdict of "
            f"{verdict.digest} for {cell.key} on {platform}, with the same image-tests, from a runner with two or more "
            f"usable GPUs in which {'it' if len(missing) == 1 else 'they'} passed{found}; run `buildtool validate "
            f"IMAGE --require-gpu -k {select}` on such a runner "
            "(--accept-skip cannot waive a GPU check)")


def _coverage_problems(cell: Cell, verdict: Verdict, local_tests: dict[str, bool] | None) -> list[str]:
    """The verdict must cover exactly what the matrix defines for the cell: its groups, every test
    those groups define, no selection."""
    problems = []
    selection = verdict.selection
    if selection.expression:
        problems.append(f"the verdict ran a selection (-k {selection.expression!r}), not the whole suite; "
                        "validate without -k")
    if selection.deselected:
        problems.append(f"the verdict deselected {len(selection.deselected)} test(s): "
                        f"{_listed(selection.deselected)}")
    wanted = list(cell.groups)       # its site checks' group too (contracts.sitetests)
    ran_groups = list(verdict.groups)
    not_run = [g for g in wanted if g not in ran_groups]
    foreign = [g for g in ran_groups if g not in wanted]
    if not_run or foreign or len(set(ran_groups)) != len(ran_groups):
        said = [f"ran groups {', '.join(foreign)} that the matrix does not give {cell.key}" if foreign else "",
                f"did not run the group(s) {', '.join(not_run)} that the matrix gives {cell.key}" if not_run else ""]
        problems.append(f"the verdict {' and '.join(s for s in said if s) or 'lists a group twice'} (it ran "
                        f"{', '.join(ran_groups) or '(none)'}; the cell's groups are {', '.join(wanted)}); "
                        "validate again with every group of the cell")
    defined = verdict.defined_tests
    if not defined:
        problems.append("the verdict lists no defined tests (a verdict from `buildtool validate` does)")
    outside = [i for i in defined if i.split("/", 1)[0] not in wanted]
    if outside:
        problems.append(f"the verdict defines tests outside the cell's groups: {_listed(outside)}")
    ran = [t.id for t in verdict.tests]
    if len(set(ran)) != len(ran):
        problems.append("the verdict lists a test more than once")
    missing, extra = set(defined) - set(ran), set(ran) - set(defined)
    if missing:
        problems.append(f"{len(missing)} defined test(s) have no result in the verdict: {_listed(missing)}")
    if extra:
        problems.append(f"the verdict has results for tests its groups do not define: {_listed(extra)}")
    wrong_group = [t.id for t in verdict.tests if t.group != t.id.split("/", 1)[0]]
    if wrong_group:
        problems.append(f"test group does not match the test id for {_listed(wrong_group)}")
    if local_tests is not None:
        here = set(local_tests)
        gone, new = here - set(defined), set(defined) - here
        if gone or new:
            problems.append("the verdict's defined tests differ from what this checkout's image-tests (same test code) "
                            f"define for {cell.key}: " + "; ".join(
                                p for p in (f"missing {_listed(gone)}" if gone else "",
                                            f"unknown {_listed(new)}" if new else "") if p))
    return problems


# -- provenance ----------------------------------------------------------------------------------

@dataclass
class StandIns:
    """The stand-in bases the mirror holds: by manifest digest, and by their layer lists."""

    digests: dict[str, str] = field(default_factory=dict)          # digest -> ref
    layers: dict[tuple[str, ...], str] = field(default_factory=dict)

    def add(self, ref: str, digest: str, layers: list[str]) -> None:
        self.digests[digest] = ref
        if layers:
            self.layers[tuple(layers)] = ref

    def built_on(self, layers: list[str]) -> str | None:
        return next((ref for base, ref in self.layers.items() if tuple(layers[: len(base)]) == base), None)


@dataclass(frozen=True)
class Platform:
    platform: str                # os/arch[/variant], or "" for a single-arch image
    digest: str
    size: int                    # config + compressed layers, bytes
    labels: dict[str, str]
    layers: tuple[str, ...] = ()
    base_labels: dict[str, str] | None = None   # labels of the base image named by its base digest, when found
    config_platform: str = ""    # os/arch[/variant] its image config declares ("" when it declares none)


def image_problems(cell: Cell, platforms: list[Platform], standins: StandIns | None = None) -> list[str]:
    """Provenance on every platform's image: stand-in labels (any key, any value), a stand-in base by
    digest, by layers or by its own labels, a base other than the matrix's, and the cell label."""
    problems = []
    standins = standins or StandIns()
    for p in platforms:
        where = f"{p.digest}" + (f" ({p.platform})" if p.platform else "")
        try:
            labels = ImageLabels.parse(p.labels)
        except LabelError as exc:
            problems.append(f"{where}: {exc}; rebuild it with `buildtool build`")
            continue
        marks = labels.standin_keys
        if marks:
            problems.append(f"{where} carries stand-in labels ({', '.join(f'{k}={p.labels[k]}' for k in marks)}); "
                            "stand-ins are test fixtures and are never released")
        base_digest = labels.base_digest
        if base_digest in standins.digests:
            problems.append(f"{where} is built on {base_digest}, the stand-in {standins.digests[base_digest]}")
        on = standins.built_on(list(p.layers))
        if on is not None and base_digest not in standins.digests:
            problems.append(f"{where} starts with the layers of the stand-in {on} (whatever its labels say)")
        if p.base_labels is not None and label_keys.standin_keys(p.base_labels):
            problems.append(f"{where} names base {base_digest}, which is labelled a stand-in")
        # base.name is the reference the build pulled (the upstream or its mirror) and base.upstream the
        # matrix base it stands for; images built before base.upstream existed name the upstream in base.name.
        base_name = labels.base_name
        upstream = labels.base_upstream or base_name
        if upstream != cell.base:
            key = label_keys.BASE_UPSTREAM if labels.base_upstream else label_keys.OCI_BASE_NAME
            problems.append(f"{where} names base {upstream or '(none)'} ({key}), not the "
                            f"matrix's {cell.base}; build it with `buildtool build`")
        elif not names_mirror_of(base_name, cell.base):
            problems.append(f"{where} was built from {base_name or '(none)'} ({label_keys.OCI_BASE_NAME}), which "
                            f"is neither the matrix's {cell.base} nor a mirror of it")
        labelled = p.labels.get(label_keys.CELL)   # absent: nothing claimed; "" claims a cell, wrongly
        if labelled is not None and labelled != cell.key:
            problems.append(f"{where} is labelled {label_keys.CELL}={labelled}, not {cell.key}")
    return problems


def provenance_problems(cell: Cell | str, digest: str, provenance: Provenance | None, platforms: list[Platform],
                        standins: StandIns | None = None) -> list[str]:
    """What the signed provenance (already verified: a trusted builder key, this digest, a revision release
    may take) must say: this cell (`cell`, or its key where no matrix is at hand: verify without a checkout), a
    base that is no stand-in by its own annotation nor by the stand-in digests the mirror holds, and the very
    base the image's labels name. None: the reader's refusal stands."""
    if provenance is None:
        return []
    problems = []
    params = provenance.buildDefinition.externalParameters
    key = cell if isinstance(cell, str) else cell.key
    if params.cell != key:
        problems.append(f"the provenance of {digest} is for cell {params.cell!r}, not {key}")
    base = provenance.base
    assert base is not None   # parse_provenance refuses a provenance without one
    base_digest = f"sha256:{base.digest.get('sha256', '')}"
    flag = base.annotations.get("standin")
    if flag is True:
        problems.append(f"the provenance of {digest} names a stand-in base (oci://{pinned_reference(base)}); stand-ins "
                        "are test fixtures and are never released")
    elif flag is not False:
        problems.append(f"the provenance of {digest} does not say whether its base is a stand-in "
                        f"(annotation standin is {flag!r}, not true or false)")
    if standins is not None and base_digest in standins.digests:
        problems.append(f"the provenance of {digest} names base {base_digest}, the stand-in "
                        f"{standins.digests[base_digest]}")
    labelled = sorted({p.labels.get(label_keys.OCI_BASE_DIGEST, "") for p in platforms})
    if labelled != [base_digest]:
        problems.append(f"the provenance of {digest} names base {base_digest}, but the image's labels name "
                        f"{', '.join(d or '(none)' for d in labelled) or '(no platform)'} "
                        f"({label_keys.OCI_BASE_DIGEST})")
    return problems


# -- platforms -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    digest: str
    platform: str                # os/arch[/variant] as the index declares it ("" when it declares none)
    media_type: str = ""
    broken: str = ""             # why its platform object is no platform at all (a field holding "/"), "" when not


def declared_platform(child: dict[str, Any]) -> str:
    plat = child.get("platform") or {}
    if not isinstance(plat, dict):
        return ""    # a platform that is no object declares none (refused by entry_problems)
    return "/".join(str(x) for x in (plat.get("os"), plat.get("architecture"), plat.get("variant")) if x)


def index_children(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of an index as written; one that is no object (or a `manifests` that is no list) is an entry that
    names no digest, refused by entry_problems, never skipped."""
    children = manifest.get("manifests") or []
    return [c if isinstance(c, dict) else {} for c in (children if isinstance(children, list) else [None])]


def index_entries(manifest: dict[str, Any]) -> list[Entry]:
    """The platform manifests of an index (BuildKit's attestation manifests left out, nothing else)."""
    found = []
    for child in index_children(manifest):
        name = declared_platform(child)
        # BuildKit's attestation manifests (unknown/unknown, annotated): no runtime selects them, so they are no
        # platform; anything else unknown is refused, never skipped.
        if name == "unknown/unknown" and platforms.is_attestation(child):
            continue
        # An OCI descriptor, not a verdict: a subscript, as tests/test_verdict_schema.py reads .get("digest") as one.
        digest = child["digest"] if "digest" in child else ""  # noqa: SIM401
        plat = child.get("platform")
        plat = plat if isinstance(plat, dict) else {}
        # Runtimes compare the fields: {"os": "linux/arm64", "architecture": "v8"} joins as linux/arm64/v8, but is none.
        broken = any("/" in str(plat.get(k) or "") for k in ("os", "architecture", "variant"))
        found.append(Entry(digest if isinstance(digest, str) else "", name, str(child.get("mediaType", "")),
                           f"its platform {json.dumps(plat)[:160]} has a '/' in a field" if broken else ""))
    return found


IN_TOTO_LAYER = "application/vnd.in-toto+json"
ATTESTATION_CONFIGS = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json",
                       "application/vnd.oci.empty.v1+json", IN_TOTO_LAYER)
REFERENCE_DIGEST = "vnd.docker.reference.digest"


def claimed_attestations(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of an index that claim to be BuildKit attestation manifests (unknown/unknown, annotated
    `vnd.docker.reference.type: attestation-manifest`): what index_entries leaves out, each to be proven one
    (attestation_problems) before it is left out of anything."""
    return [child for child in index_children(manifest)
            if declared_platform(child) == "unknown/unknown" and platforms.is_attestation(child)]


def attestation_problems(entry: dict[str, Any], manifest: dict[str, Any] | None, others: set[str]) -> list[str]:
    """Why an index entry that claims to be an attestation manifest is not one (empty: it is). It is one only
    when its own manifest (`manifest`, read by its digest; None: unreadable) holds nothing a runtime could run
    (a config of an image-config or in-toto type, and only in-toto layers, at least one) and its
    `vnd.docker.reference.digest` names another entry of the same index (`others`: the platform entries'
    digests). Anything else is an image nobody validated that the index would carry, by digest, into a release."""
    digest = str(entry["digest"]) if "digest" in entry else ""   # noqa: SIM401 (a descriptor, not a verdict)
    where = f"index entry {digest} (unknown/unknown, annotated attestation-manifest)"
    if manifest is None:
        return [f"{where}: its manifest cannot be read, so it cannot be shown to be an attestation; push the cell "
                "again"]
    why = []
    if "manifests" in manifest:
        why.append("it is an index")
    config_type = str((manifest.get("config") or {}).get("mediaType", ""))
    if config_type not in ATTESTATION_CONFIGS:
        why.append(f"its config is a {config_type or '(none)'}")
    layers = manifest.get("layers") or []
    wrong = sorted({str(layer.get("mediaType", "")) for layer in layers if layer.get("mediaType") != IN_TOTO_LAYER})
    if not layers:
        why.append("it has no in-toto layer")
    elif wrong:
        why.append(f"it has layers of type {', '.join(t or '(none)' for t in wrong)}, not only {IN_TOTO_LAYER}")
    subject = str((entry.get("annotations") or {}).get(REFERENCE_DIGEST, ""))
    if subject not in others or subject == digest:
        why.append(f"its {REFERENCE_DIGEST} {subject or '(none)'} is not another entry of the index")
    if not why:
        return []
    return [f"{where} is not an attestation: {'; '.join(why)}; an index is released only when every image in it "
            "was validated: push the cell again"]


def known_platform(name: str) -> str | None:
    """The toolkit's name of an `os/arch[/variant]` (linux/arm64/v8 is linux/arm64); None when unknown."""
    parts = name.split("/")
    try:
        return platforms.from_descriptor({"os": parts[0], "architecture": parts[1] if len(parts) > 1 else "",
                                          "variant": "/".join(parts[2:])}).name
    except platforms.UnknownPlatform:
        return None


def entry_problems(cell: Cell, entries: list[Entry]) -> list[str]:
    """Why an index's platform manifests are not exactly the cell's platforms (empty: they are). Every
    entry counts: one of a platform the toolkit does not know is refused by name, never skipped (a
    runtime on that platform would pull it, untested)."""
    from buildtool.registry.client import INDEX_TYPES

    problems: list[str] = []
    seen: dict[str, str] = {}
    expected = ", ".join(cell.platforms)
    for e in entries:
        if not e.digest:
            problems.append(f"an index entry ({e.platform or 'no platform'}) names no digest (or is no descriptor): "
                            "no runtime can pull it, and nothing can be read for it; push the cell again")
            continue
        name = known_platform(e.platform)
        if e.broken:
            problems.append(f"index entry {e.digest} is broken: {e.broken} (os, architecture and variant are one word "
                            "each), so no runtime selects it; push the cell again")
            if name is not None:
                continue    # its fields joined name a known platform, but it is none
        if not e.platform:
            problems.append(f"index entry {e.digest} declares no platform: every manifest of the index must be one "
                            f"platform of {cell.key} ({expected})")
        elif name is None:
            problems.append(f"{e.platform} ({e.digest}): a platform this toolkit does not know (it knows "
                            f"{', '.join(platforms.KNOWN)}); an index is released only when every platform in it "
                            "was validated: push the cell again")
        elif name not in cell.platforms:
            problems.append(f"{name} ({e.digest}): not a platform the matrix gives {cell.key} ({expected}); "
                            "push the cell again")
        elif name in seen:
            problems.append(f"{name} is in the index twice ({seen[name]} and {e.digest}): which one a runtime pulls "
                            "is not defined; push the cell again")
        if e.media_type in INDEX_TYPES:
            problems.append(f"{e.platform or 'index entry'} ({e.digest}) is itself an index, not one platform's "
                            "image manifest")
        if name is not None:
            seen.setdefault(name, e.digest)
    for name in cell.platforms:
        if name not in seen:
            problems.append(f"the index has no {name} manifest, a platform the matrix gives {cell.key}; push the "
                            "cell again (every platform)")
    return problems


def served_index(platform: str, digest: str) -> str:
    """Why an index entry whose digest the registry serves as an index is refused (release and verify alike)."""
    return f"{platform} ({digest}): the registry serves an index for it, not one platform's image manifest; push the " \
        "cell again"


def config_platform_problems(found: list[Platform], expected: dict[str, str]) -> list[str]:
    """Each platform image's config must declare the platform it is released as (`expected`: digest ->
    platform): an index entry saying linux/arm64 over an amd64 image would run nowhere it claims to. One with no
    image read (read_platforms passes an index over) names an index, whatever mediaType its entry declares."""
    read = {p.digest for p in found}
    return [served_index(want, digest) for digest, want in expected.items() if digest not in read] + [
        f"{want} ({p.digest}): its image config declares {p.config_platform or 'no platform'}, not {want}"
        for p in found if (want := expected.get(p.digest)) is not None and known_platform(p.config_platform) != want]


def recorded_platform_problems(cell: Cell, platform: str, verdict: Verdict, in_index: bool) -> list[str]:
    """The verdict must record the platform it is counted for (schema 5): a verdict of the amd64 image
    copied onto the arm64 one names the wrong subject anyway, and the wrong platform too. A GPU cell's
    verdict must come from a native run: an emulated GPU run is not a GPU run. A schema-4 verdict records
    no platform: it counts only for a single-manifest image (its digest is that one platform's image)."""
    if verdict.schema_ < 5 and not in_index:
        return []
    problems = []
    if verdict.platform != platform:
        problems.append(f"the verdict records platform {verdict.platform or '(none)'}, not {platform}; validate "
                        f"{platform} (each platform of the index has its own verdict)")
    if verdict.emulated and is_gpu_cell(cell):
        problems.append(f"the verdict ran {platform} under emulation, but {cell.key} is a GPU cell: its GPU tests "
                        f"count only from a native {platform} GPU runner")
    return problems
