"""A stand-in for the registry client the benches clean up with: the tags it holds per repository, and the
requests (DELETEs) it was asked, recorded."""

from __future__ import annotations


class TagRegistry:
    def __init__(self, held: dict[str, dict[str, str]] | None = None) -> None:
        self.held: dict[str, dict[str, str]] = held if held is not None else {}
        self.deleted: list[str] = []

    def tags(self, repo: str) -> list[str]:
        return list(self.held.get(repo, {}))

    def manifest_digest(self, repo: str, tag: str) -> str | None:
        return self.held.get(repo, {}).get(tag)

    def request(self, method: str, path: str, **_: object) -> None:
        self.deleted.append(f"{method} {path}")
