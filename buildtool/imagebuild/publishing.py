"""How a built image reaches its dev tag: pushed under its staging tag, its config normalised (repro_config), its
SBOM and signed provenance attached to the digest, and only then the same manifest put at the dev tag. A mixin of
imagebuild.builder.Builder, whose state (registry client, builder key, options) it reads."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from buildtool.attest.bundles import ensure_bundle
from buildtool.attest.dsse import EnvelopeError, PrivateKey
from buildtool.attest.provenance_model import PREDICATE_TYPE as PROVENANCE_PREDICATE
from buildtool.attest.provenance_store import attach_provenance, find_provenance, only_key
from buildtool.common.errors import FailedError, UserError
from buildtool.common.refs import split_repo
from buildtool.contracts.names import push_staging_tag
from buildtool.imagebuild import aptlock, engine, multiplatform, push_path, repro_config
from buildtool.imagebuild.bases import push_verified
from buildtool.imagebuild.contents import LockedContents, attach_sbom
from buildtool.imagebuild.lock import read_locks
from buildtool.imagebuild.progress import Progress
from buildtool.imagebuild.provenance import Built, facts_from_build, make_provenance, tools
from buildtool.matrix.plan import CellPlan
from buildtool.registry.client import RegistryClient, RegistryError
from buildtool.registry.image_index import MAX_CONFIG_BYTES
from buildtool.sbom.document import find_sbom
from buildtool.sbom.signing import SBOM_PREDICATE, plain_sbom_problem, signed_by

if TYPE_CHECKING:
    from collections.abc import Callable

    from buildtool.imagebuild.builder import BuildOptions, CellResult


class Publishing:
    root: Path
    registry: RegistryClient
    options: BuildOptions
    progress: Progress
    log: Callable[[str], None]
    _key: PrivateKey | None
    _lock: threading.Lock
    _pushed: dict[str, tuple[Path | None, str, tuple[str, ...]]]

    def source_date_epoch(self) -> int:
        raise NotImplementedError

    def _push_ref(self, plan: CellPlan, ref: str, build_log: Path | None = None) -> str:
        log_text = build_log.read_text(errors="replace") if build_log is not None else None
        via = push_path.choose(self.options.push_with, log_text)
        self.progress.update(plan.cell.key, "pushing", f"{ref} ({via})")
        push_verified(ref, self.log, via=via)
        return self._normalised(ref, build_log)

    def _normalised(self, ref: str, build_log: Path | None) -> str:
        """The image just pushed to `ref`, its config's times set to the commit's and its build metadata (the
        inline cache) kept apart under the cache tag (repro_config): two builds of one commit, one digest.
        Returns the digest `ref` names now; remembers what its provenance states about the push."""
        host, repo, tag = split_repo(ref)
        published = repro_config.publish_normalised(self.registry, repo, tag, self.source_date_epoch())
        with self._lock:
            self._pushed[published.digest] = (build_log, f"{host}/{repo}@{published.cache}" if published.cache
                                              else "", published.changed)
        return published.digest

    def _push(self, plan: CellPlan, build_log: Path | None = None) -> str:
        """Upload the local dev tag's image by the path push_path chooses for it (`build_log`: this run built it)
        under its staging tag (names.push_staging_tag), not the dev tag: _publish writes that once the SBOM and
        provenance are attached. Returns the digest the registry holds."""
        log_text = build_log.read_text(errors="replace") if build_log is not None else None
        via = push_path.choose(self.options.push_with, log_text)
        staging = f"{plan.dev_repo}:{push_staging_tag(plan.dev_tag)}"
        self.progress.update(plan.cell.key, "pushing", f"{staging} ({via})")
        engine.tag(plan.dev_ref, staging)
        try:
            push_verified(staging, self.log, via=via)
            return self._normalised(staging, build_log)
        finally:
            try:
                engine.untag(staging)     # the local store keeps only the dev tag
            except Exception as exc:  # noqa: BLE001 - a leftover local tag is harmless; say it
                self.log(f"[{plan.cell.key}] could not remove the local tag {staging}: {exc}")

    def _attach_platform(self, plan: CellPlan, platform: str, digest: str, key: str, began: datetime) -> dict[str, str]:
        """SBOM and provenance of one platform's image, attached to its own manifest digest."""
        ref = f"{plan.dev_repo}:{multiplatform.platform_tag(plan.dev_tag, platform)}"
        sbom = self._ensure_sbom(plan, ref, digest, platform)
        provenance = self._ensure_provenance(plan, ref, digest, began, datetime.now(UTC))
        return {"platform": platform, "digest": digest, "content_key": key, "sbom": sbom, "provenance": provenance}

    def _publish(self, plan: CellPlan, digest: str) -> None:
        """Put the manifest `digest` (already in the dev repository, its attestations attached) at the dev tag:
        the same bytes, so the digest cannot change; checked by reading the tag back."""
        _, repo, _ = split_repo(plan.dev_ref)
        self.progress.update(plan.cell.key, "tagging", f"{plan.dev_ref} -> {digest}")
        body, media_type, held = self.registry.get_manifest(repo, digest)
        if held != digest:
            raise FailedError(f"{repo}@{digest}: the registry served a manifest whose digest is {held}")
        self.registry.put_manifest(repo, plan.dev_tag, body, media_type)
        now = self.registry.manifest_digest(repo, plan.dev_tag)
        if now != digest:
            raise FailedError(f"{plan.dev_ref} names {now} after putting {digest} there")

    def _attach_all(self, plan: CellPlan, result: CellResult, began: datetime) -> None:
        """A pushed digest gets its SBOM and its signed provenance (each kept when already there); then, unless
        the dev tag already named it ("up to date"), the dev tag is put on it (_publish). Attaching that fails
        leaves the dev tag unwritten: the image is only under its staging tag, which is never a dev tag."""
        if not (self.options.push and result.digest.startswith("sha256:")):
            return
        tagged = result.result == "up to date"
        finished = datetime.now(UTC)
        try:
            result.sbom = self._ensure_sbom(plan, plan.dev_ref, result.digest, plan.cell.platforms[0])
            result.provenance = self._ensure_provenance(plan, plan.dev_ref, result.digest, began, finished)
        except (FailedError, RegistryError, RuntimeError, OSError) as exc:
            cause = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            if tagged:
                # Pushed by an earlier run that did not attach them: distribution cannot untag (it deletes
                # manifests, not tags), so say what is left.
                raise FailedError(f"{plan.dev_ref} is in the registry as {result.digest}, but attaching its SBOM "
                                  f"and provenance failed ({cause}); that dev tag is there without them, which "
                                  "validate reports and release refuses: fix the cause and re-run build --push, "
                                  "which attaches them") from None
            raise FailedError(f"dev tag {plan.dev_ref} not written: attaching the SBOM and provenance of "
                              f"{result.digest} failed, so the image is only at {push_staging_tag(plan.dev_tag)} "
                              f"(never read as a dev tag); fix the cause and re-run build --push. Cause: "
                              f"{cause}") from None
        if not tagged:
            self._publish(plan, result.digest)

    def _ensure_provenance(self, plan: CellPlan, ref: str, digest: str, began: datetime, finished: datetime) -> str:
        """Sign and attach the provenance of the image `digest` (tagged `ref`), unless one this builder key
        signed already verifies (a no-op rebuild keeps it). Any failure is the cell's failure, one line naming
        the cause. Returns the provenance artifact's digest."""
        assert self._key is not None, "run() reads the builder key before a push"
        _, repo, _ = split_repo(ref)
        found = find_provenance(self.registry, repo, digest, only_key(self._key.public()))
        if found.provenance is not None:
            if found.referrer is not None:   # kept from a push before bundles were published: add its bundle
                ensure_bundle(self.registry, repo, digest, found.referrer, PROVENANCE_PREDICATE)
            return found.artifact
        self.progress.update(plan.cell.key, "provenance", "signing the build's provenance")
        try:
            body = json.loads(self.registry.get_manifest(repo, digest)[0])
            config = json.loads(self.registry.get_blob(repo, body["config"]["digest"], limit=MAX_CONFIG_BYTES))
            labels = dict((config.get("config") or {}).get("Labels") or {})
            platform = "/".join(str(config[k]) for k in ("os", "architecture", "variant") if config.get(k))
            log, cache, changed = self._pushed.get(digest, (None, "", ()))
            # Not pushed by this run: built by an earlier one on this machine, its cell's log when the record
            # beside it names this very image.
            local = None if log else str((engine.image_attrs(ref) or {}).get("Id", ""))
            log = log or self.options.log_dir / f"{plan.cell.name}-{plan.cell.version}.log"
            facts = facts_from_build(log, local, self.source_date_epoch(), cache, changed)
            provenance = make_provenance(self.root, self.options.matrix or self.root / "matrix.yaml", plan,
                                         Built(labels, platform, tuple(config.get("history") or ())),
                                         (began, finished), tools(self.root), facts,
                                         self._key.public().keyid)
            return attach_provenance(self.registry, repo, digest, provenance, self._key).digest
        except (FailedError, UserError, EnvelopeError, RegistryError, ValueError, KeyError) as exc:
            raise FailedError(f"provenance of {ref}: {exc}") from None

    def _ensure_sbom(self, plan: CellPlan, ref: str, digest: str, platform: str) -> str:
        """Every pushed digest gets its SBOM (of `platform`'s locks), plain and signed by the builder key (both
        kept when this key already signed the plain one). Returns the SBOM artifact's digest."""
        registry_host, repo, _ = split_repo(ref)
        key = self._key
        if key is None:
            raise FailedError("a push signs the image's SBOM with the builder key, and none was read "
                              "(buildtool build --push reads DL_IMAGES_BUILDER_KEY, else the local dev key)")
        found = find_sbom(self.registry, repo, digest)
        signed = signed_by(self.registry, repo, digest, key.public())
        if found is not None and signed is not None and not plain_sbom_problem(self.registry, repo, digest,
                                                                                signed.digest):
            ensure_bundle(self.registry, repo, digest, signed.referrer, SBOM_PREDICATE)   # as the provenance's
            return found.digest
        if engine.image_attrs(ref) is None:
            # Reused by content key (built by another commit or machine) and not signed by this key yet: the
            # SBOM is made from the image itself, pulled by the digest pushed.
            pinned = f"{registry_host}/{repo}@{digest}"
            self.progress.update(plan.cell.key, "sbom", "pulling the image to probe its packages")
            try:
                engine.pull(pinned)
                engine.tag(pinned, ref)
            except RuntimeError as exc:
                raise FailedError(f"{ref} has no SBOM signed by this builder key in the registry, and "
                                  f"pulling it to make one failed ({exc}); rebuild it with --force --push") from None
        self.progress.update(plan.cell.key, "sbom", f"probing the {platform} image's packages")
        locked = LockedContents(read_locks(self.root, plan.cell, platform),
                                aptlock.read_hashes(self.root, plan.cell, platform),
                                (plan.cell.index_url or "", *plan.cell.extra_index_urls))
        return attach_sbom(self.root, self.registry, repo, digest, ref, locked, key)
