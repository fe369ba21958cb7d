"""What a registry call can fail with; each message is one line that names the host and what to fix.

buildtool.registry.client re-exports the first three, which most callers import from there.
"""

from __future__ import annotations

from buildtool.common.errors import FailedError, UserError


class RegistryError(FailedError):
    """A registry refused a request or stayed unreachable after retries (exit 1)."""


class RegistryUnreachable(UserError):
    """No registry answers at this address at all (exit 2: the setting is wrong or it is down)."""


class NotFound(RegistryError):
    pass


class RegistryAuthError(RegistryError):
    """The registry or its token server wants credentials this command does not have (exit 2: fix the setup)."""

    exit_code = 2


class NoCredentials(RegistryAuthError):
    pass


class CredentialsRefused(RegistryAuthError):
    pass


class InsufficientScope(RegistryAuthError):
    pass


class RegistryTLSError(RegistryError):
    """The TLS handshake failed (certificate verification, most often): never retried (exit 2)."""

    exit_code = 2


class TooLarge(RegistryError):
    """An answer, blob or artifact layer over the size this client reads to: refused, not read further."""


class RateLimited(RegistryError):
    """429/503 with a Retry-After longer than this command may wait."""
