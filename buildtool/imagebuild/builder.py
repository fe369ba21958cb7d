"""`buildtool build`: build, tag and push dev images, and skip what is already built.

Per cell: resolve the base to a digest, compute the content key (plan.content_key), then
- an image with the dev tag and that key exists (registry or local store): nothing to do;
- an image with that key exists under another tag: retag it (in the registry a manifest PUT,
  no bytes move and nothing is pulled; locally an engine tag);
- otherwise build it with BuildKit (pip settings as secrets), taking the layers that did not change
  from the newest earlier dev images of the cell whose provenance a trusted builder signed
  (buildtool.imagebuild.cache_sources), tag it, push it if asked.
A push never leaves a dev tag that looks complete without its attestations: the dev tag is written last, after
the SBOM and signed provenance are attached to the digest pushed under its staging tag
(buildtool.imagebuild.publishing; docs/registries.md#build---push-and-attestations).
Cells run with bounded parallelism; one failing cell never stops the others, and it
leaves no dev tag behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from buildtool.attest.dsse import PrivateKey, PublicKey
from buildtool.attest.trust import Trusted
from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import split_repo
from buildtool.contracts import label_keys, platforms
from buildtool.contracts.names import parse_dev_tag
from buildtool.imagebuild import aptlock, cache_sources, engine, multiplatform, push_path, repro_config
from buildtool.imagebuild.bases import fill_bases, is_loopback_registry, recipe_suite, stale_platforms
from buildtool.imagebuild.cell_inputs import (
    BaseInfo,
    build_labels,
    built_for,
    cell_content_key,
    scrub,
    scrub_log,
    secret_strings,
)
from buildtool.imagebuild.lock import locked_versions
from buildtool.imagebuild.pipconfig import HostPip, PipSecrets, package_indexes, pip_secrets, reachable
from buildtool.imagebuild.progress import LogProgress, Progress, StepWatcher
from buildtool.imagebuild.publishing import Publishing
from buildtool.matrix.plan import CellPlan, Settings, full_revision
from buildtool.matrix.schema import Cell
from buildtool.registry.client import NotFound, RegistryClient, RegistryError, RegistryUnreachable, RetryPolicy
from buildtool.registry.image_index import Child, platform_manifest, put_index

Log = Callable[[str], None]


@dataclass(frozen=True)
class BuildOptions:
    push: bool = False
    force: bool = False
    jobs: int = 2
    log_dir: Path = Path("build-logs")
    timeout: float = 3600
    fill_bases: bool = True  # fill a loopback BASE_MIRROR with missing bases (`buildtool bases`)
    # The key a push signs each image's provenance and SBOM with (attest.keys.signing_key, role builder: that layer
    # is above this one, so the caller hands it in); read once before anything builds. Required with push.
    builder_key: Callable[[], PrivateKey] | None = None
    matrix: Path | None = None   # the matrix file the plans came from (its digest goes into the provenance)
    # Take unchanged layers from earlier dev images in the registry (cache_sources), trusting the builder keys
    # `cache_trust` returns for this build's own key (None when it does not push). No trust, no registry cache.
    registry_cache: bool = True
    push_with: str = push_path.AUTO     # push_path.CHOICES: who uploads a built image
    cache_trust: Callable[[PublicKey | None], Trusted] | None = None
    # Which platforms of a multi-platform cell a build without push makes (empty: every one). A push makes every
    # platform: the dev tag names the index over all of them.
    platforms: tuple[str, ...] = ()


@dataclass
class CellResult:
    cell: str
    result: str  # built, retagged, up to date, pushed, failed, skipped
    ref: str = ""
    digest: str = ""
    size: int = 0
    seconds: float = 0.0
    message: str = ""
    log: str = ""
    content_key: str = ""
    sbom: str = ""   # digest of the SBOM artifact attached to the pushed digest
    provenance: str = ""   # digest of the signed provenance artifact attached to the pushed digest
    # A multi-platform cell: per platform, its image's digest (registry manifest, or local image id), content
    # key, SBOM and provenance; `digest` is then the index's.
    platforms: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result != "failed"

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _client(host: str, quick: bool = False) -> RegistryClient:
    retry = RetryPolicy(attempts=2, first_delay=0.5, timeout=15) if quick else RetryPolicy(timeout=60)
    return RegistryClient(host, retry=retry)   # the client asks Docker Hub's API host for docker.io


def resolve_base(plan: CellPlan, platform: str | None = None) -> BaseInfo | None:
    """Digest and labels of the base the build of `platform` (default: the cell's first) will pull; None when
    its registry has no such tag or no image of that platform. Raises RegistryUnreachable when the registry
    cannot be reached at all."""
    host, repo, tag = split_repo(plan.base)
    client = _client(host, quick=True)
    try:
        # That platform's entry of an index by its own digest, so a build pins exactly the image it builds on.
        digest, config = platform_manifest(client, repo, tag, platform or plan.cell.platforms[0])
    except NotFound:
        return None
    except RegistryUnreachable:
        raise RegistryUnreachable(f"no connection to {client.host}") from None
    except RegistryError as exc:
        if "Connection" in str(exc) or "Timeout" in str(exc):
            raise RegistryUnreachable(f"registry {host} cannot be reached") from None
        raise
    labels = (config.get("config") or {}).get("Labels") or {}
    return BaseInfo(ref=plan.base, digest=digest, labels=dict(labels))


class Builder(Publishing):
    """One `build` run over several cells."""

    def __init__(self, root: Path, source: str, settings: Settings, revision: str, options: BuildOptions,
                 log: Log, progress: Progress | None = None):
        self.root = root
        self.progress: Progress = progress or LogProgress(log)
        self._steps: StepWatcher | None = None
        self.source = source
        self.settings = settings
        self.revision = revision
        # The revision label names the whole commit (refused now, before any cell builds, when it cannot).
        self.label_revision = full_revision(root, revision)
        self.options = options
        self.log = log
        self._lock = threading.Lock()
        self._key: PrivateKey | None = None     # the builder key, read by run() when pushing
        self.registry = _client(split_repo(f"{settings.registry}/x:y")[0])
        # Asked for only when a cell really builds: a no-op run stays well under a second.
        self._host_pip: HostPip | None = None
        self._secrets: PipSecrets | None = None
        self._stack = ExitStack()
        self._client: engine.BuildClient | None = None
        self._candidates: dict[str, list[cache_sources.Candidate]] = {}   # cell key -> earlier dev images seen
        self._cache_trust: Trusted | None = None
        # Pushed digest -> (its build's log, its inline cache's digest-pinned reference, what the push path
        # normalised in its config): what its provenance states (repro_config, provenance.facts_from_build).
        self._pushed: dict[str, tuple[Path | None, str, tuple[str, ...]]] = {}
        self._epoch: int | None = None

    def source_date_epoch(self) -> int:
        """The commit's time (SOURCE_DATE_EPOCH): the pushed config's times (repro_config)."""
        if self._epoch is None:
            self._epoch = repro_config.commit_time(self.root, self.label_revision)
        return self._epoch

    def _build_env(self) -> tuple[engine.BuildClient, PipSecrets, HostPip]:
        with self._lock:
            if self._client is None:
                self._client = engine.resolve_build_client()
            if self._secrets is None:
                self._host_pip = HostPip.from_host()
                self._secrets = self._stack.enter_context(pip_secrets(self._host_pip))
                # uv fails on an index it cannot reach: say which of the host's are left out of uv.toml.
                reachable(tuple(u for u in (self._host_pip.index_url, *self._host_pip.extra_index_urls) if u),
                          self.log, self._host_pip.cert)
            assert self._host_pip is not None
            return self._client, self._secrets, self._host_pip

    # -- lookups ---------------------------------------------------------------------------

    def _registry_match(self, plan: CellPlan, key: str) -> tuple[str, str] | None:
        """(tag, digest) of an image in the dev repo with this content key, the dev tag first. The
        images passed over are remembered: they are what a build of the cell may take layers from."""
        _, repo, _ = split_repo(plan.dev_ref)
        seen: list[cache_sources.Candidate] = []
        for tag in self._dev_tags(plan, repo):
            try:
                digest, config = platform_manifest(self.registry, repo, tag, platforms.DEFAULT[0])
            except NotFound:
                continue
            labels = dict((config.get("config") or {}).get("Labels") or {})
            if labels.get(label_keys.CONTENT_KEY) == key:
                return tag, digest
            seen.append(cache_sources.Candidate(tag, digest, labels))
        with self._lock:
            self._candidates[plan.cell.key] = seen
        return None

    def _dev_tags(self, plan: CellPlan, repo: str) -> list[str]:
        """The cell's dev tags in the dev repo: the plan's own first, then the others newest first."""
        tags = self.registry.tags(repo)
        others = sorted((t for t in tags if t != plan.dev_tag and parse_dev_tag(t, plan.cell.version)), reverse=True)
        return [plan.dev_tag, *others] if plan.dev_tag in tags else others

    def _cache_from(self, plan: CellPlan, platform: str | None = None) -> list[str]:
        """The earlier dev images this build takes unchanged layers from (cache_sources), each logged; for
        one platform of a multi-platform cell, the earlier indexes' images of that platform."""
        if self.options.force:
            return []
        candidates = self._candidates.get(plan.cell.key if platform is None else f"{plan.cell.key} {platform}", [])
        if not (self.options.registry_cache and candidates) or self.options.cache_trust is None:
            return []
        with self._lock:
            if self._cache_trust is None:
                self._cache_trust = self.options.cache_trust(self._key.public() if self._key else None)
        registry_host, repo, _ = split_repo(plan.dev_ref)
        chosen = cache_sources.choose(self.registry, registry_host, repo, candidates, self._cache_trust,
                                      lambda line: self.log(f"[{plan.cell.key}] {line}"))
        if chosen:
            self.log(f"[{plan.cell.key}] taking unchanged layers from {', '.join(chosen)}")
        return chosen

    # -- one cell --------------------------------------------------------------------------

    def run_cell(self, plan: CellPlan, base: BaseInfo) -> CellResult:
        cell = plan.cell
        started = time.monotonic()
        log_path = self.options.log_dir / f"{cell.name}-{cell.version}.log"
        result = CellResult(cell=cell.key, result="failed", ref=plan.dev_ref, log=str(log_path))
        self.progress.update(cell.key, "checking", "content key and existing images")
        began = datetime.now(UTC)
        if cell.multi_platform:
            self._run_platforms(plan, result, log_path, began)
        else:
            try:
                result.content_key = key = cell_content_key(plan, self.root, base)
                if self.options.force or not self._reuse(plan, key, result):
                    self._build(plan, base, key, log_path, result)
                self._attach_all(plan, result, began)
            except (engine.BuildFailed, FailedError, RegistryError, RuntimeError, OSError, UserError) as exc:
                # UserError too (a missing lock), as for a multi-platform cell: one cell never stops the others.
                result.result = "failed"
                # Long enough for _attach_all's message with its cause (one line: references, a digest, the error).
                result.message = str(exc).splitlines()[0][:700] if str(exc) else type(exc).__name__
                result.digest = ""
                self._drop_stale_dev_tag(plan, result.content_key)
        result.seconds = time.monotonic() - started
        return result

    # -- a multi-platform cell (buildtool.imagebuild.multiplatform) ----------------------------------

    def _run_platforms(self, plan: CellPlan, result: CellResult, log_path: Path, began: datetime) -> None:
        """Each platform's image by its own content key (reused, retagged or built with --platform), then,
        with push, the index over them at the dev tag; any platform failing fails the cell before the index
        is written, so the dev tag never names a half index."""
        cell = plan.cell
        _, repo, _ = split_repo(plan.dev_ref)
        keys: dict[str, str] = {}
        try:
            wanted = self.platforms_of(cell)
            bases = {p: self._platform_base(plan, p) for p in wanted}
            if cell.native_installs:
                # Each platform's native stages run on this machine's image of the base: in its key and its labels.
                host = platforms.host().name
                build = bases[host] if host in bases else self._platform_base(plan, host)
                bases = {p: replace(b, build=build) for p, b in bases.items()}
            keys = {p: cell_content_key(plan, self.root, bases[p], p) for p in wanted}
            result.content_key = keys[wanted[0]]
            if self.options.push and not self.options.force:
                earlier = multiplatform.read_indexes(self.registry, repo, self._dev_tags(plan, repo))
                with self._lock:
                    for platform in cell.platforms:
                        self._candidates[f"{cell.key} {platform}"] = multiplatform.platform_candidates(
                            earlier, platform, exclude=plan.dev_tag)
                match = multiplatform.matching_index(self.registry, repo, earlier, keys)
                if match:
                    # Each platform's attestations first, then (another commit's index) the dev tag: a manifest
                    # PUT, no layer moves.
                    children = multiplatform.index_children(self.registry, repo, match[0]) or {}
                    result.platforms = [self._attach_platform(plan, p, children[p].digest, keys[p], began)
                                        for p in keys]
                    if match[0] == plan.dev_tag:
                        result.result, result.digest = "up to date", match[1]
                        result.message = "the registry already holds this dev tag's index with the same content keys"
                    else:
                        body, media_type, digest = self.registry.get_manifest(repo, match[0])
                        self.registry.put_manifest(repo, plan.dev_tag, body, media_type)
                        result.result, result.digest = "retagged", digest
                        result.message = (f"same content keys as {repo}:{match[0]}; tagged in the registry, "
                                          "nothing rebuilt")
                    return
            built: list[Child] = []
            local: dict[str, str] = {}
            actions = []
            for platform in wanted:
                tag = multiplatform.platform_tag(plan.dev_tag, platform)
                arch_log = log_path.with_name(f"{log_path.stem}-{platforms.get(platform).architecture}.log")
                try:
                    action, image = self._platform_image(plan, platform, f"{plan.dev_repo}:{tag}", bases[platform],
                                                         keys[platform], arch_log)
                except (engine.BuildFailed, FailedError, RegistryError, RuntimeError, OSError) as exc:
                    # The cell fails naming the platform; the platforms already pushed stay under their own
                    # tags, and the dev tag is not written: no half index.
                    raise FailedError(f"{platform}: {exc}") from None
                actions.append(f"{platform} {action}")
                local[platform] = image
                if self.options.push:
                    built.append(multiplatform.child_of(self.registry, repo, tag, platform))
            if self.options.push:
                result.platforms = self._attach_platforms(plan, built, keys, began)
                result.digest = put_index(self.registry, repo, plan.dev_tag, built)
                result.result = "pushed"
            else:
                # No registry index: the dev tag names this machine's own platform's image, when it is one of them.
                native = platforms.host().name
                if native in local:
                    engine.tag(local[native], plan.dev_ref)
                result.digest = local.get(native, "")
                result.platforms = [{"platform": p, "digest": local[p], "content_key": keys[p]} for p in keys]
                result.result = "up to date" if all(a.endswith(" up to date") for a in actions) else "built"
            result.message = "; ".join(actions)
        except (engine.BuildFailed, FailedError, RegistryError, RuntimeError, OSError, UserError) as exc:
            result.result = "failed"
            result.message = str(exc).splitlines()[0][:700] if str(exc) else type(exc).__name__
            result.digest = ""
            result.platforms = []
            # The local dev tag names this machine's platform's image (a build without push): one of other content,
            # an earlier build's, must not stay as this commit's image, as for a single-platform cell.
            self._drop_stale_dev_tag(plan, keys.get(platforms.host().name, ""))

    def _attach_platforms(self, plan: CellPlan, built: list[Child], keys: dict[str, str],
                          began: datetime) -> list[dict[str, str]]:
        """Each platform image's SBOM and provenance, before the index goes to the dev tag: attaching that fails
        leaves the dev tag unwritten, and the one line says so (docs/registries.md#build---push-and-attestations)."""
        try:
            return [self._attach_platform(plan, c.platform, c.digest, keys[c.platform], began) for c in built]
        except (FailedError, RegistryError, RuntimeError, OSError) as exc:
            cause = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise FailedError(f"dev tag {plan.dev_ref} not written: attaching the SBOMs and provenance of its platform "
                              f"images failed, so they are only at their platform tags (never read as dev tags); fix "
                              f"the cause and re-run build --push. Cause: {cause}") from None

    def platforms_of(self, cell: Cell) -> tuple[str, ...]:
        """The platforms of `cell` this build makes: every one, or those of BuildOptions.platforms (no push)."""
        if not (cell.multi_platform and self.options.platforms):
            return cell.platforms
        chosen = tuple(p for p in cell.platforms if p in self.options.platforms)
        if not chosen:
            raise FailedError(f"{cell.key} is built for {', '.join(cell.platforms)}, none of "
                              f"{', '.join(self.options.platforms)}: name one of them with --platform (PLATFORM=)")
        return chosen

    def _platform_base(self, plan: CellPlan, platform: str) -> BaseInfo:
        found = resolve_base(plan, platform)   # None: no such tag, or no image of that platform
        if found is None:
            raise FailedError(f"base {plan.base} has no {platform} image; run `make bases FRAMEWORK={plan.cell.name} "
                              f"BASE_MIRROR={self.settings.base_mirror or '127.0.0.1:5000'}`")
        return found

    def _platform_image(self, plan: CellPlan, platform: str, ref: str, base: BaseInfo, key: str,
                        log_path: Path) -> tuple[str, str]:
        """(what was done, image id or digest) for one platform's image, tagged `ref` (and pushed with push)."""
        _, repo, tag = split_repo(ref)
        if not self.options.force:
            if self.options.push and multiplatform.content_key_of(self.registry, repo, tag) == key:
                return "up to date", self.registry.manifest_digest(repo, tag) or ""
            labels = engine.image_labels(ref) or {}
            if labels.get(label_keys.CONTENT_KEY) == key:
                return ("pushed", self._push_ref(plan, ref)) if self.options.push else \
                    ("up to date", str((engine.image_attrs(ref) or {}).get("Id", "")))
        problem = platforms.binfmt_problem(platform)
        if problem:
            raise FailedError(f"cannot build {platform}: {problem}")
        self.log(f"[{plan.cell.key}] building {platform} on {base.pinned} (log: {log_path})")
        self.progress.update(plan.cell.key, "building", f"{platform} with BuildKit")
        image_id = self._buildkit(plan, base, key, log_path, platform)
        engine.tag(image_id, ref)
        if self.options.push:
            return "built and pushed", self._push_ref(plan, ref, log_path)
        return "built", image_id

    def _reuse(self, plan: CellPlan, key: str, result: CellResult) -> bool:
        """Retag or skip when an image with this content key exists. True when done."""
        _, repo, _ = split_repo(plan.dev_ref)
        local = engine.image_attrs(plan.dev_ref)
        if local is not None and ((local.get("Config") or {}).get("Labels") or {}).get(label_keys.CONTENT_KEY) != key:
            local = None   # the local dev tag holds other content
        match = self._registry_match(plan, key)
        if match and match[0] == plan.dev_tag:
            result.result, result.digest = "up to date", match[1]
            result.message = "the registry already holds this dev tag with the same content key"
            result.size = local["Size"] if local else 0
            return True
        if match:
            # Same content under another commit's tag: a manifest PUT, no layer moves. With push, the PUT comes
            # after the attestations are checked (_attach_all, then _publish).
            if self.options.push:
                digest = match[1]
            else:
                body, media_type, digest = self.registry.get_manifest(repo, match[0])
                self.registry.put_manifest(repo, plan.dev_tag, body, media_type)
            result.result, result.digest = "retagged", digest
            result.message = f"same content key as {repo}:{match[0]}; tagged in the registry, nothing rebuilt"
            return True
        if local is not None:
            result.size = int(local["Size"])
            if self.options.push:
                result.digest = self._push(plan)
                result.result, result.message = "pushed", "built earlier with the same content key; pushed"
            else:
                result.result, result.digest = "up to date", str(local["Id"])
                result.message = "the local store already holds this dev tag with the same content key"
            return True
        same = built_for(plan, engine.find_by_label(label_keys.CONTENT_KEY, key))
        if same:
            engine.tag(same[0]["Id"], plan.dev_ref)
            result.size = int(same[0].get("Size", 0))
            result.digest = self._push(plan) if self.options.push else str(same[0]["Id"])
            result.result = "retagged"
            result.message = "same content key as a local image; tagged, nothing rebuilt"
            return True
        return False

    def _buildkit(self, plan: CellPlan, base: BaseInfo, key: str, log_path: Path, platform: str | None) -> str:
        """The one BuildKit build of a cell's image (PLATFORM: one platform of a multi-platform cell, else
        None): labels, secrets, the registry cache; the log scrubbed of the host's index credentials. Its id."""
        client, secrets, host_pip = self._build_env()
        dockerfile = self.root / plan.cell.dockerfile
        labels = build_labels(plan, base, key, self.label_revision, self.source,
                              locked_versions(self.root, plan.cell, platform))
        files = secrets.files   # the locks name every file's URL: no index of the cell's is asked
        cache_from = self._cache_from(plan, platform)
        build_args = {**plan.build_args, "BASE_IMAGE": base.pinned}
        if plan.cell.native_installs:
            # The native stages (templates/parts/native.j2) run on this machine's image of the same base.
            build_args["BUILD_BASE_IMAGE"] = (base.build or (base if platform == platforms.host().name
                                              else self._platform_base(plan, platforms.host().name))).pinned
        self._say_lock_base(plan, base, platform)
        # The cell's own index URLs (its locks were resolved from them), as the SBOM's locked contents name them.
        cell_indexes = (plan.cell.index_url or "", *plan.cell.extra_index_urls)
        if self._steps is not None:
            self._steps.watch(plan.cell.key, log_path)
        try:
            return engine.build(client, engine.BuildRequest(dockerfile.parent, dockerfile,
                                build_args=build_args, labels=labels,
                                secrets=files, log_path=log_path, timeout=self.options.timeout,
                                no_cache=self.options.force, cache_from=cache_from, platform=platform,
                                package_indexes=package_indexes(host_pip, cell_indexes),
                                log_secrets=secret_strings(host_pip)))
        finally:
            if self._steps is not None:
                self._steps.unwatch(plan.cell.key)
            scrub_log(log_path, secret_strings(host_pip))

    def _say_lock_base(self, plan: CellPlan, base: BaseInfo, platform: str | None) -> None:
        """Say so when the apt lock was resolved in another base than this build's (the base follows the archive:
        the build's apt step still installs exactly the lock's versions, and stops on anything else apt adds)."""
        if not aptlock.has_apt_step(plan.cell):
            return
        try:
            resolved = aptlock.read(self.root, plan.cell, platform)
        except UserError:
            return     # the build's own checks name a missing or broken lock
        named = resolved.header["resolved-in"].split(" ", 1)[0].rpartition("@")[2]
        if named != base.digest:
            self.log(f"[{plan.cell.key}] note: its apt lock was resolved in base {named[:19]}, this build's base is "
                     f"{base.digest[:19]} (another archive state: `make lock FRAMEWORK={plan.cell.key}` resolves it "
                     "in this one)")

    def _build(self, plan: CellPlan, base: BaseInfo, key: str, log_path: Path, result: CellResult) -> None:
        self.log(f"[{plan.cell.key}] building on {base.ref} (log: {log_path})")
        self.progress.update(plan.cell.key, "building", "starting BuildKit")
        image_id = self._buildkit(plan, base, key, log_path, None)
        engine.tag(image_id, plan.dev_ref)
        result.size = int((engine.image_attrs(plan.dev_ref) or {}).get("Size", 0))
        result.digest, result.result = image_id, "built"
        if self.options.push:
            result.digest = self._push(plan, log_path)

    def _drop_stale_dev_tag(self, plan: CellPlan, key: str) -> None:
        """A failed build must not leave a dev tag that looks like this commit's image."""
        try:
            labels = engine.image_labels(plan.dev_ref)
            if labels and labels.get(label_keys.CONTENT_KEY) != key:
                engine.untag(plan.dev_ref)
        except Exception as exc:  # noqa: BLE001 - best effort on the failure path
            self.log(f"[{plan.cell.key}] could not check for a stale dev tag: {exc}")

    # -- many cells ------------------------------------------------------------------------

    def resolve_bases(self, plans: list[CellPlan]) -> tuple[dict[str, BaseInfo], dict[str, str]]:
        """Base info per cell key, and a reason per cell whose base cannot be had."""
        infos: dict[str, BaseInfo] = {}
        missing: dict[str, str] = {}
        mirror = self.settings.base_mirror
        auto = self.options.fill_bases and mirror and "=" not in mirror and is_loopback_registry(mirror)
        # The platforms whose bases a build without push needs: those it makes, and this machine's (the native
        # stages of a multi-platform cell run on its image of the base). Empty: every platform.
        only = tuple(dict.fromkeys((*self.options.platforms, platforms.host().name))) if self.options.platforms else ()
        if auto:
            to_fill = []
            for plan in plans:
                try:
                    # Every platform the cell builds needs its base; one made here by an older recipe is made
                    # again (it gave unreproducible layers).
                    needed = tuple(p for p in plan.cell.platforms if not only or p in only)
                    if needed and stale_platforms(plan.base, needed, recipe_suite(plan.cell)):
                        to_fill.append(plan.cell)
                except RegistryUnreachable:
                    raise UserError(f"BASE_MIRROR registry {mirror} is unreachable; start it with "
                                    "`bash scripts/setup.sh`") from None
            if to_fill:
                self.log(f"filling {mirror} with missing bases for {', '.join(c.key for c in to_fill)} "
                         "(as `buildtool bases` does)")
                fill_bases(list({c.key: c for c in to_fill}.values()), mirror, force=False, log=self.log,
                           log_dir=self.options.log_dir, templates=self.root / "templates", only=only)
        for plan in plans:
            try:
                info = resolve_base(plan)
            except RegistryUnreachable as exc:
                missing[plan.cell.key] = (f"base {plan.base} cannot be reached ({exc}); build with "
                                          "BASE_MIRROR=127.0.0.1:5000 (missing bases are then made in the local "
                                          "registry, as `make bases` does)")
                continue
            if info is None:
                missing[plan.cell.key] = (f"base {plan.base} does not exist; run `make bases FRAMEWORK="
                                          f"{plan.cell.name} BASE_MIRROR={mirror or '127.0.0.1:5000'}`")
                continue
            infos[plan.cell.key] = info
        return infos, missing

    def run(self, plans: list[CellPlan]) -> list[CellResult]:
        if self.options.push and self.options.platforms:
            raise UserError("--platform: a push writes each cell's image index over every platform it is built "
                            "for; build some platforms without --push")
        engine.sdk()
        try:
            self.registry.ping()
        except RegistryUnreachable:
            raise UserError(f"registry {self.settings.registry} is unreachable; start the local one with "
                            "`bash scripts/setup.sh` or set REGISTRY to a reachable registry") from None
        if self.options.push:
            # Read now, not after a long build: a push without its builder key fails before anything builds.
            if self.options.builder_key is None:
                raise UserError("--push signs each image's provenance and SBOM, and no builder key was given "
                                "(DL_IMAGES_BUILDER_KEY, or the local dev key)")
            self._key = self.options.builder_key()
            push_path.choose(self.options.push_with, None)   # an unknown push path is said before anything builds
            # Credentials and push scope for every dev repository, before anything builds: a push whose
            # attestations could not be written would leave a dev tag without them.
            for repo in dict.fromkeys(split_repo(p.dev_ref)[1] for p in plans):
                self.registry.check_push(repo)
        infos, missing = self.resolve_bases(plans)
        if missing and not infos:
            raise UserError(next(iter(missing.values())))
        self.options.log_dir.mkdir(parents=True, exist_ok=True)
        results: dict[str, CellResult] = {}
        for key, reason in missing.items():
            results[key] = CellResult(cell=key, result="skipped", message=reason)
            self.log(f"[{key}] skipped: {reason}")
        todo = [p for p in plans if p.cell.key in infos]
        for p in todo:
            self.progress.update(p.cell.key, "queued")
        with StepWatcher(self.progress, scrub=self._scrub) as self._steps:
            try:
                with self._stack, ThreadPoolExecutor(max_workers=max(1, self.options.jobs)) as pool:
                    futures = {p.cell.key: pool.submit(self.run_cell, p, infos[p.cell.key]) for p in todo}
                    for key, future in futures.items():
                        r = results[key] = future.result()
                        self.progress.update(key, r.result, r.message)
            finally:
                self._steps = None
        return [results[p.cell.key] for p in plans]

    def _scrub(self, line: str) -> str:
        """A log line with the host's pip secrets (tokens in index URLs) masked."""
        return scrub(line, secret_strings(self._host_pip)) if self._host_pip else line
