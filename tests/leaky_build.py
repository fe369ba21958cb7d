"""A build stand-in whose output holds the host's package-index token (as pip or uv print the URL they failed on),
then fails: for tests that the benches mask it as the builder does."""

from __future__ import annotations

import sys
from pathlib import Path

from buildtool.imagebuild.engine import BuildClient
from buildtool.imagebuild.pipconfig import HostPip

TOKEN = "s3cr3t-index-token"
INDEX = f"https://ci:{TOKEN}@pypi.example/simple"


def host() -> HostPip:
    return HostPip(index_url=INDEX)


def client(folder: Path) -> BuildClient:
    """Any arguments taken; prints pip's error naming the index URL with its token on stdout and stderr, exits 1.
    A script in `folder`: the command line (which a build's log and errors name) holds no token."""
    script = folder / "leaky-build.py"
    script.write_text(f"import sys\nline = 'ERROR: Could not fetch {INDEX}/numpy/ (HTTP 401)'\nprint(line)\n"
                      "print(line, file=sys.stderr)\nsys.exit(1)\n")
    return BuildClient((sys.executable, str(script)), (), "buildx")
