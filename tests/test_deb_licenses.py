"""Debian's license names as SPDX (buildtool.sbom.deb_licenses, issue 40): the table, compounds, and
the names kept as Debian wrote them because they map to nothing SPDX lists."""

from __future__ import annotations

import pytest

from buildtool.sbom.deb_licenses import TABLE, package_expression, spdx_of


@pytest.mark.parametrize(("debian", "spdx"), [
    ("GPL-2+", "GPL-2.0-or-later"), ("GPL-2", "GPL-2.0-only"), ("GPL-3+", "GPL-3.0-or-later"),
    ("LGPL-2.1+", "LGPL-2.1-or-later"), ("LGPL-3", "LGPL-3.0-only"), ("Expat", "MIT"), ("BSD-3-clause", "BSD-3-Clause"),
    ("bsd-2-clause", "BSD-2-Clause"), ("Apache-2", "Apache-2.0"), ("Artistic", "Artistic-1.0-Perl"),
    ("zlib", "Zlib"), ("GFDL-NIV-1.3+", "GFDL-1.3-no-invariants-or-later"), ("public-domain", None),
    ("permissive", None), ("GPL", None), ("LGPL", None), ("Unicode", None), ("", None),
    ("GPL-2+ or Artistic", "GPL-2.0-or-later OR Artistic-1.0-Perl"),
    ("BSD-3-clause and GPL-2", "BSD-3-Clause AND GPL-2.0-only"),
    ("GPL-1+ or Artistic, and Expat", "(GPL-1.0-or-later OR Artistic-1.0-Perl) AND MIT"),
    ("GPL-3+ with Bison exception", "GPL-3.0-or-later WITH Bison-exception-2.2"),
    ("GPL-2+ with Autoconf exception", "GPL-2.0-or-later WITH Autoconf-exception-2.0"),
    ("GPL-3+ with Autoconf exception", "GPL-3.0-or-later WITH Autoconf-exception-3.0"),
    ("GPL-2 with Linux-syscall-note exception", "GPL-2.0-only WITH Linux-syscall-note"),
    ("GPL-2+ with distribution exception", None),          # no SPDX exception of that name
    ("BSD-3-clause or GPL", None),                         # one part maps to nothing: the whole stays Debian's
    ("ISC and/or LGPL-2.1+", None),                        # and/or: neither AND nor OR
])
def test_debian_names_map_to_spdx_where_spdx_has_them(debian: str, spdx: str | None) -> None:
    assert spdx_of(debian) == spdx


def test_every_table_entry_is_an_spdx_expression_the_parser_accepts() -> None:
    from packaging.licenses import canonicalize_license_expression

    for debian, spdx in TABLE.items():
        assert canonicalize_license_expression(spdx) == spdx, debian
        assert spdx_of(debian) == spdx


def test_a_package_is_the_and_of_its_files_licenses_or_none_when_one_does_not_map() -> None:
    assert package_expression(["GPL-2+", "LGPL-2.1+", "GPL-2+"]) == "GPL-2.0-or-later AND LGPL-2.1-or-later"
    assert package_expression(["GPL-2+"]) == "GPL-2.0-or-later"
    assert package_expression(["GPL-2+", "public-domain"]) is None
    assert package_expression([]) is None


@pytest.mark.parametrize(("debian", "spdx"), [
    # copyright-format 1.0, "Syntax": `and` binds tighter than `or` unless a comma comes before it.
    ("GPL-2+ or Artistic and Expat", "GPL-2.0-or-later OR (Artistic-1.0-Perl AND MIT)"),
    ("Expat and GPL-2+ or BSD-3-clause", "(MIT AND GPL-2.0-or-later) OR BSD-3-Clause"),
    ("GPL-2+ or Artistic, and Expat", "(GPL-2.0-or-later OR Artistic-1.0-Perl) AND MIT"),
    ("GPL-2+ and Expat, or BSD-3-clause", "(GPL-2.0-or-later AND MIT) OR BSD-3-Clause"),
])
def test_and_binds_tighter_than_or_unless_a_comma_comes_before_it(debian: str, spdx: str) -> None:
    """Was the other way round: `A or B and C` became `(A OR B) AND C`, a license the package never offered
    (Artistic alone no longer sufficed, GPL alone was no choice)."""
    assert spdx_of(debian) == spdx
