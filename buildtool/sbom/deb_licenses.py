"""Debian's license names (the short names of machine-readable copyright files, DEP-5) as SPDX (issue 40).

A copyright file names licenses in Debian's words: `GPL-2+`, `Expat`, `BSD-3-clause`, `GPL-3+ with Bison
exception`, `GPL-1+ or Artistic, and Expat`. Scanners and policy engines match SPDX ids, so the SBOM gives
the SPDX form where Debian's name maps to one (TABLE, DEP-5's own table of short names and SPDX's list),
and keeps the name as Debian wrote it where it does not (`public-domain`, `permissive`, an unversioned
`GPL`: guessing a version would be a claim nobody made). A compound name (`or`, `and`, `, and`, `with ...
exception`) maps only when every part does; every result is checked against the SPDX license list
(packaging's parser), so nothing that is not SPDX is written as if it were.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

# Debian short name (lower case) -> SPDX id. DEP-5: `+` is "or later"; without it the version is exact.
TABLE = {
    "apache-2": "Apache-2.0", "apache-2.0": "Apache-2.0",
    # Debian's /usr/share/common-licenses/Artistic is Perl's Artistic License.
    "artistic": "Artistic-1.0-Perl", "artistic-2.0": "Artistic-2.0",
    "bsd-2": "BSD-2-Clause", "bsd-2-clause": "BSD-2-Clause", "bsd-2-clause-netbsd": "BSD-2-Clause-NetBSD",
    "bsd-3": "BSD-3-Clause", "bsd-3-clause": "BSD-3-Clause",
    "bsd-4-clause": "BSD-4-Clause", "bsd-4-clause-uc": "BSD-4-Clause-UC",
    "bsl-1": "BSL-1.0", "bsl-1.0": "BSL-1.0",
    "cc-by-3.0": "CC-BY-3.0", "cc0-1.0": "CC0-1.0",
    "expat": "MIT", "mit": "MIT", "x11": "X11", "isc": "ISC",
    "fsfap": "FSFAP", "fsful": "FSFUL", "fsfullr": "FSFULLR",
    "gpl-1": "GPL-1.0-only", "gpl-1+": "GPL-1.0-or-later",
    "gpl-2": "GPL-2.0-only", "gpl-2.0": "GPL-2.0-only", "gpl-2+": "GPL-2.0-or-later", "gpl-2.0+": "GPL-2.0-or-later",
    "gpl-3": "GPL-3.0-only", "gpl-3.0": "GPL-3.0-only", "gpl-3+": "GPL-3.0-or-later", "gpl-3.0+": "GPL-3.0-or-later",
    "lgpl-2": "LGPL-2.0-only", "lgpl-2.0": "LGPL-2.0-only", "lgpl-2+": "LGPL-2.0-or-later",
    "lgpl-2.0+": "LGPL-2.0-or-later", "lgpl-2.1": "LGPL-2.1-only", "lgpl-2.1+": "LGPL-2.1-or-later",
    "lgpl-3": "LGPL-3.0-only", "lgpl-3.0": "LGPL-3.0-only", "lgpl-3+": "LGPL-3.0-or-later",
    "lgpl-3.0+": "LGPL-3.0-or-later",
    "agpl-3": "AGPL-3.0-only", "agpl-3+": "AGPL-3.0-or-later",
    "gfdl-1.2": "GFDL-1.2-only", "gfdl-1.2+": "GFDL-1.2-or-later", "gfdl-1.3": "GFDL-1.3-only",
    "gfdl-1.3+": "GFDL-1.3-or-later", "gfdl-niv-1.3": "GFDL-1.3-no-invariants-only",
    "gfdl-niv-1.3+": "GFDL-1.3-no-invariants-or-later", "gfdl-1.3+-no-invariant": "GFDL-1.3-no-invariants-or-later",
    "mpl-1.1": "MPL-1.1", "mpl-2": "MPL-2.0", "mpl-2.0": "MPL-2.0", "ms-pl": "MS-PL",
    "zlib": "Zlib", "beerware": "Beerware", "latex2e": "Latex2e", "sleepycat": "Sleepycat",
    "kazlib": "Kazlib",
    "gpl-2+-autoconf-exception": "GPL-2.0-or-later WITH Autoconf-exception-2.0",
    "gpl-3+-autoconf-exception": "GPL-3.0-or-later WITH Autoconf-exception-3.0",
    "gpl-2+-libtool-exception": "GPL-2.0-or-later WITH Libtool-exception",
    "gpl-3+-with-bison-exception": "GPL-3.0-or-later WITH Bison-exception-2.2",
    "psf-2": "PSF-2.0", "openssl": "OpenSSL", "curl": "curl", "unlicense": "Unlicense", "wtfpl": "WTFPL",
}
# `<license> with <name> exception` -> the SPDX exception (Autoconf's depends on the GPL's version).
EXCEPTIONS = {
    "bison": "Bison-exception-2.2", "bison-2.2": "Bison-exception-2.2",
    "linux-syscall-note": "Linux-syscall-note", "texinfo": "Texinfo-exception",
    "autoconf-2": "Autoconf-exception-2.0", "autoconf-3": "Autoconf-exception-3.0",
}
_WITH = re.compile(r"^(\S+) with (\S+) exception$", re.IGNORECASE)


def _simple(name: str) -> str | None:
    match = _WITH.match(name)
    if match is None:
        return TABLE.get(name.lower())
    license_id = TABLE.get(match.group(1).lower())
    if license_id is None:
        return None
    exception = match.group(2).lower()
    if exception == "autoconf" and license_id.startswith("GPL-"):
        exception = f"autoconf-{license_id[4]}"
    found = EXCEPTIONS.get(exception)
    return f"{license_id} WITH {found}" if found else None


def _join(parts: Sequence[str | None], operator: str) -> str | None:
    if any(p is None for p in parts):
        return None
    wrapped = [f"({p})" if " OR " in p or (" AND " in p and operator == "OR") else p for p in parts if p]
    return f" {operator} ".join(wrapped)


@lru_cache(maxsize=1024)
def spdx_of(name: str) -> str | None:
    """The SPDX expression of one Debian license name, or None when it (or any part of it) maps to none.
    DEP-5 precedence (copyright-format 1.0, "Syntax"): `, and` / `, or` bind loosest, then `or`, then `and`
    (`A or B and C` is `A or (B and C)`, as in SPDX; `A or B, and C` is `(A or B) and C`)."""
    text = " ".join(name.split())
    if not text or "and/or" in text.lower():
        return None
    expression: str | None
    top = re.split(r",\s*(and|or)\s+", text, flags=re.IGNORECASE)
    if len(top) > 1:
        parts, operators = top[0::2], {o.upper() for o in top[1::2]}
        expression = _join([spdx_of(p) for p in parts], operators.pop()) if len(operators) == 1 else None
    elif re.search(r"\s+or\s+", text, re.IGNORECASE):
        expression = _join([spdx_of(p) for p in re.split(r"\s+or\s+", text, flags=re.IGNORECASE)], "OR")
    elif re.search(r"\s+and\s+", text, re.IGNORECASE):
        expression = _join([spdx_of(p) for p in re.split(r"\s+and\s+", text, flags=re.IGNORECASE)], "AND")
    else:
        expression = _simple(text)
    return expression if expression is not None and canonical_spdx(expression) is not None else None


def canonical_spdx(expression: str) -> str | None:
    """`expression` in SPDX's canonical form (`mit or apache-2.0` -> `MIT OR Apache-2.0`: ids as the list spells
    them, operators upper case), or None when it is not an SPDX expression (`Apache 2.0`, `MIT OR`)."""
    from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

    try:
        return str(canonicalize_license_expression(expression))
    except InvalidLicenseExpression:
        return None


def package_expression(names: list[str] | tuple[str, ...]) -> str | None:
    """One SPDX expression for a package whose copyright file names `names` (its files are under each:
    AND), or None when any name maps to none."""
    mapped = [spdx_of(n) for n in sorted(set(names))]
    return _join(sorted({m for m in mapped if m}), "AND") if mapped and None not in mapped else None
