"""The roles a key signs in, and what a reader of signed attestations needs of the trusted keys.

Which key signs and which keys release trusts (config/trusted-keys.yaml) is buildtool.attest.keys; its
TrustedKeys satisfies `Trusted`. Stages below validate (registry, imagebuild) read signatures through
`Trusted`, so that they need not import the stage that loads the keys.
"""

from __future__ import annotations

from typing import Protocol

from buildtool.attest.dsse import PublicKey

BUILDER, TESTER = "builder", "tester"     # the builder signs provenance and SBOMs, the tester verdicts
ROLES = (BUILDER, TESTER)


class Trusted(Protocol):
    """The trusted keys as a reader of attestations sees them."""

    @property
    def keys(self) -> dict[str, PublicKey]: ...

    def for_role(self, role: str) -> dict[str, PublicKey]:
        """The keys trusted in `role` (keyid -> key)."""

    def role_problem(self, keyid: str, role: str) -> str:
        """Why a signature by `keyid` does not count in `role` ("" when it does)."""

    def describe(self, keyid: str) -> str:
        """The key id, short, with the name it is trusted under, for messages."""

    def untrusted_hint(self, keyid: str) -> str:
        """How to trust the untrusted signer `keyid` where the reader may (this machine's dev key on a loopback
        registry: --trust-local-key), as the refusal to show; "" when there is no such way."""
