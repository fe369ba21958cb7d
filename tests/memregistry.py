"""An in-memory registry with the calls buildtool.attest.referrers and the readers make (no referrers
API: the OCI fallback index, as distribution 2.8 here), for unit tests that attach and read artifacts
without a registry process. Anyone holding it can do what anyone with push access can."""

from __future__ import annotations

from email.utils import formatdate
from typing import Any

from buildtool.registry.call_errors import TooLarge
from buildtool.registry.client import OCI_MANIFEST, NotFound, RegistryError, sha256_digest


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content

    def json(self) -> Any:
        import json

        return json.loads(self.content)


class MemRegistry:
    def __init__(self, host: str = "127.0.0.1:5999") -> None:
        self.host = host
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], tuple[bytes, str]] = {}
        self.no_referrers_api: set[str] = set()
        self.subject_indexed: set[str] = set()     # never: it sends no OCI-Subject, the fallback index is written

    def ping(self) -> None:
        """It always answers."""

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), sink: Any = None, **_: Any) -> Any:
        """A manifest GET (the release lock's read), answered as distribution answers it, with its Date; no other
        call. A body the `sink` takes is written to it (and is not the answer's content), as the transport does."""
        repo, manifests, ref = path.rpartition("/manifests/")
        if method == "GET" and manifests:
            found = self.manifests.get((repo, ref))
            date = {"Date": formatdate(usegmt=True)}
            if found is not None:
                headers = {**date, "Content-Type": found[1]}
                write = sink(200, headers) if sink is not None else None
                if write is not None:
                    write(found[0])
                return _Answer(200, headers, b"" if write is not None else found[0])
            if 404 in ok:
                return _Answer(404, date, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
        raise NotFound(f"{method} {path}: no such API here")

    def answer(self, method: str, path: str, **_: Any) -> Any:
        """What distribution 2.8 answers a referrers API call: 404 page not found."""
        return _Answer(404, {"Content-Type": "text/plain; charset=utf-8"}, b"404 page not found")

    def get_manifest(self, repo: str, ref: str) -> tuple[bytes, str, str]:
        try:
            raw, media_type = self.manifests[(repo, ref)]
        except KeyError:
            raise NotFound(f"{repo}:{ref} not found") from None
        return raw, media_type, sha256_digest(raw)

    def manifest_digest(self, repo: str, ref: str) -> str | None:
        found = self.manifests.get((repo, ref))
        return sha256_digest(found[0]) if found else None

    def put_manifest(self, repo: str, ref: str, body: bytes, media_type: str) -> str:
        digest = sha256_digest(body)
        if ref.startswith("sha256:") and ref != digest:
            raise RegistryError(f"{ref} is not the digest of the manifest")
        self.manifests[(repo, digest)] = self.manifests[(repo, ref)] = (body, media_type)
        return digest

    def put_blob(self, repo: str, data: bytes) -> str:
        digest = sha256_digest(data)
        self.blobs[digest] = data
        return digest

    def get_blob(self, repo: str, digest: str, limit: int | None = None) -> bytes:
        if digest not in self.blobs:
            raise NotFound(f"blob {digest} not found")
        if limit is not None and len(self.blobs[digest]) > limit:
            raise TooLarge(f"blob {digest} of {repo} is over the {limit}-byte limit; not read further")
        return self.blobs[digest]

    def has_blob(self, repo: str, digest: str) -> bool:
        return digest in self.blobs

    def mount_blobs(self, repo: str, digests: list[str], from_repo: str) -> list[str]:
        return []       # one blob store for every repository: every mount succeeds, nothing is uploaded

    def tags(self, repo: str) -> list[str]:
        return sorted(ref for r, ref in self.manifests if r == repo and not ref.startswith("sha256:"))

    def push_image(self, repo: str, tag: str, payload: bytes = b"layer", *, architecture: str = "amd64",
                   labels: dict[str, str] | None = None) -> str:
        """A one-layer image manifest (of linux/`architecture`, with `labels`); returns its digest."""
        import json

        body = (json.dumps({"architecture": architecture, "os": "linux", "config": {"Labels": labels}}).encode()
                if architecture != "amd64" or labels else b'{"architecture":"amd64","os":"linux"}')
        config, layer = self.put_blob(repo, body), self.put_blob(repo, payload)
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config,
                               "size": len(body)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer,
                                "size": len(payload)}]}
        return self.put_manifest(repo, tag, json.dumps(manifest).encode(), OCI_MANIFEST)
