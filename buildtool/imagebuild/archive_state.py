"""The state of the Debian archive a build's apt step read, for the provenance (issue 40; docs/release-trust.md
says why it is read this way): the build log names each release file apt fetched, and the builder fetches
those same URLs once the build is done, recording each file's sha256 and `Date:`, and whether it may have
been published during the build. A log without the lines (no apt step, or an image this run did not build)
gives no record.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from buildtool.common.errors import FailedError

TIMEOUT_S = 30
# apt's progress line for a release file: Get (fetched) or Hit (unchanged since the lists were made).
_FETCHED = re.compile(r"\b(?:Get|Hit):\d+ (\S+) (\S+) InRelease\b")
Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class ReleaseFile:
    uri: str          # e.g. http://deb.debian.org/debian/dists/bookworm/InRelease
    sha256: str
    date: str         # its Date: field, RFC 3339 UTC
    published_during_build: bool


def release_urls(build_log: str) -> list[str]:
    """The InRelease URLs the apt step read, in the order apt fetched them, each once."""
    found = [f"{m.group(1).rstrip('/')}/dists/{m.group(2)}/InRelease" for m in _FETCHED.finditer(build_log)]
    return list(dict.fromkeys(found))


def observe(build_log: str, began: datetime, fetch: Fetch | None = None) -> list[ReleaseFile]:
    """The release files the build's apt step read (release_urls), as the archive serves them now."""
    return [read_release(uri, fetch, began)[0] for uri in release_urls(build_log)]


def read_release(uri: str, fetch: Fetch | None = None, began: datetime | None = None) -> tuple[ReleaseFile, datetime]:
    """The release file at `uri` as the archive serves it now (published during the build: dated from `began` on),
    and its Date; FailedError naming the URI when it has no Date or the Date does not parse."""
    data = (fetch or get)(uri)
    match = re.search(rb"^Date: (.+)$", data, re.MULTILINE)
    try:
        if match is None:
            raise ValueError("no Date field")
        text = match.group(1).decode().strip()
        date = parsedate_to_datetime(text)
        if date.tzinfo is None and not text.endswith("-0000"):   # RFC 5322's -0000 is UTC; no zone is this host's
            raise ValueError(f"its Date {text[:60]!r} names no time zone")
        date = date.replace(tzinfo=date.tzinfo or UTC).astimezone(UTC)
        if date.year < 1970:   # its Unix time is the base's SOURCE_DATE_EPOCH, never negative
            raise ValueError(f"its Date {text[:60]!r} is before 1970")
    except OverflowError:
        raise FailedError(f"{uri}: not a Debian release file (its Date {text[:60]!r} is past year 9999 in UTC)") \
            from None
    except (ValueError, TypeError) as exc:
        raise FailedError(f"{uri}: not a Debian release file ({exc})") from None
    return ReleaseFile(uri, hashlib.sha256(data).hexdigest(), date.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       began is not None and date >= began), date


def get(uri: str) -> bytes:
    """The file at `uri` (a Debian archive's release file); FailedError naming it when it cannot be read."""
    import requests

    from buildtool.common.urls import no_netrc

    try:
        with requests.Session() as session:
            # No ~/.netrc login (its `default` entry goes to any host) to the archive, nor to where it redirects
            # (requests reads the netrc again for each new host): the build's apt never had it. Proxies still count.
            session.auth = no_netrc
            session.rebuild_auth = lambda prepared, response: None   # type: ignore[method-assign]
            response = session.get(uri, timeout=TIMEOUT_S)
    except requests.RequestException as exc:
        raise FailedError(f"the Debian archive's {uri} cannot be read ({type(exc).__name__}): the base and the "
                          "provenance record the release file") from None
    if response.status_code != 200:
        raise FailedError(f"the Debian archive's {uri} answered {response.status_code} (the base and the "
                          "provenance record the release file)")
    return response.content
