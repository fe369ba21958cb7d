"""URLs as the toolkit may show or record them: never with credentials (issue 52).

A package index or a timestamp authority is named by a URL that may carry a secret: userinfo
(`https://user:token@host/simple`), a token in the query (`?token=...`) or the fragment. `public_url`
keeps scheme, host, port and path, and drops the rest; a token some index puts in the path itself
(`https://host/<token>/simple`) cannot be told from a path and is the caller's to keep out (docs say so).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def public_url(url: str) -> str:
    """`url` without userinfo, query or fragment; "" for what does not parse as a URL with a scheme. Everything up to
    the last `@` is userinfo, as shown_url reads it: a token with an unescaped `/`, `?` or `#`
    (`https://tok/en@host/simple`) ends the authority early for a URL parser, which kept it as host and path."""
    scheme, sep, rest = url.strip().partition("://")
    if sep and scheme.lower() != "file":   # a file URL has no userinfo: an `@` in it is the path's
        url = f"{scheme}://{rest.rpartition('@')[2]}"
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return ""
    if not parts.scheme:
        return ""
    if parts.scheme == "file":
        return urlunsplit(("file", "", parts.path, "", ""))
    if not host:
        return ""
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def shown_url(url: str) -> str:
    """What a message may show of `url`: public_url, else (a bad port, no scheme) the text with its userinfo
    masked and its query and fragment cut, where a secret rides; never the text as given. Everything up to the
    last `@` counts as userinfo: a token with an unescaped `/`, `?` or `#` (`https://u:ab/cd@host`) ends the
    authority early for a URL parser, and was shown whole (or in part) for a path or a query."""
    before, at, after = url.rpartition("@")
    if at:
        scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", before)
        url = (scheme.group(0) if scheme else "") + "****@" + after
    return public_url(url) or re.split(r"[?#]", url, maxsplit=1)[0]


def no_netrc(request: Any) -> Any:
    """requests' auth hook that leaves a request as it was made: without it requests sends ~/.netrc's entry for a
    host (its `default` entry for any host) in place of the Authorization header the caller chose, or none."""
    return request
