"""How a built image goes to the registry: the engine's push or skopeo's, whichever is faster for it (measured
in docs/contents.md, bench/bench_push.py and bench/bench_fresh_runner.py). skopeo's gzip runs on every core, the
engine's on one thread; but after a build that took its unchanged layers from the registry cache
(buildtool.imagebuild.cache_sources) the engine knows where those are and uploads only the changed ones, which
skopeo, reading the image back from the engine uncompressed, cannot know. So an image whose build pulled layers for
a build step is pushed by the engine, any other image this run built by skopeo, and one it did not build by the
engine, which skips what it pushed or pulled before. Both are checked the same way (push_verified: the registry
must serve the digest the push reported).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from buildtool.common.errors import UserError
from buildtool.common.refs import split_repo
from buildtool.registry.tools import skopeo_access

ENGINE, SKOPEO, AUTO = "engine", "skopeo", "auto"
CHOICES = (AUTO, ENGINE, SKOPEO)
SKOPEO_TIMEOUT_S = 1800

_VERTEX = re.compile(r"^#(\d+) \[[^\]]*\] (.*)$")
_PULL = re.compile(r"^#(\d+) pulling sha256:")


def took_registry_layers(build_log: str) -> bool:
    """The build pulled layers for a step other than a FROM: BuildKit took that step's result from the
    registry cache, so the engine knows where those layers already are."""
    steps: dict[str, str] = {}
    for line in build_log.splitlines():
        header = _VERTEX.match(line)
        if header:
            steps.setdefault(header.group(1), header.group(2))
            continue
        pull = _PULL.match(line)
        if pull and not steps.get(pull.group(1), "FROM").startswith("FROM "):
            return True
    return False


def choose(setting: str, build_log: str | None) -> str:
    """ENGINE or SKOPEO for one push; `build_log` None: the image was not built by this run (the engine
    may know its layers from an earlier push or pull), so the engine, as before."""
    if setting not in CHOICES:
        raise UserError(f"push path {setting!r} is unknown; use one of {', '.join(CHOICES)}")
    if setting != AUTO:
        return setting
    return ENGINE if build_log is None or took_registry_layers(build_log) else SKOPEO


def skopeo_push(ref: str, insecure: bool | None = None, timeout: float = SKOPEO_TIMEOUT_S) -> str:
    """`skopeo copy docker-daemon:REF docker://REF`; returns the manifest digest skopeo wrote. The engine
    is the one DOCKER_HOST names (skopeo itself reads only its own flag for it). The registry's credentials,
    CA and plain-HTTP setting are RegistryClient's (buildtool.registry.tools: a private auth file, never
    argv); `insecure` is decided there (kept for callers). RuntimeError on failure (push_verified retries)."""
    if shutil.which("skopeo") is None:
        raise UserError("skopeo is not installed (it pushes images this build made from scratch); run "
                        "`bash scripts/setup.sh`, or push with the engine: --push-with engine")
    registry, _, _ = split_repo(ref)   # a reference with a registry and a tag, or ReferenceError
    with tempfile.TemporaryDirectory(prefix="buildtool-push-") as tmp, skopeo_access(registry, "dest") as access:
        digest_file = Path(tmp) / "digest"
        host = os.environ.get("DOCKER_HOST", "")
        # `access`: plain HTTP for a loopback registry; CA; --dest-authfile
        argv = ["skopeo", "copy", "--quiet", "--digestfile", str(digest_file),
                *(["--src-daemon-host", host] if host else []), *access, f"docker-daemon:{ref}", f"docker://{ref}"]
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"skopeo copy of {ref} timed out after {timeout:.0f}s") from None
        if run.returncode != 0:
            lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
            raise RuntimeError(f"skopeo copy of {ref} exited {run.returncode}: {(lines or ['no output'])[-1][:300]}")
        digest = digest_file.read_text().strip() if digest_file.is_file() else ""
    if not digest.startswith("sha256:"):
        raise RuntimeError(f"skopeo copy of {ref} reported no digest")
    return digest
