"""Print what the image contains as one JSON object on stdout: Python distributions (PEP 503
names -> versions, the first on sys.path wins, as for an import), Debian packages, Python
version, OS, CUDA. Standard library only; one exec per image (image-tests and the SBOM step).
Under the image-tests harness ($IMAGETEST_OUT set) the same object also goes to result.json,
which is what the tests read (the build runs this file's text with `python -c`)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import subprocess
import sys


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            # The first one on sys.path wins, as it does for an import.
            found.setdefault(_norm(name), dist.version)
    return dict(sorted(found.items()))


def apt_packages() -> dict[str, str]:
    if not shutil.which("dpkg-query"):
        return {}
    run = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${binary:Package}\t${Version}\n"],
                         capture_output=True, text=True, timeout=60)
    found = {}
    for line in run.stdout.splitlines():
        status, name, version = (line.split("\t") + ["", ""])[:3]
        if status.startswith("ii"):
            found[name] = version
    return dict(sorted(found.items()))


def os_release() -> str:
    try:
        with open("/etc/os-release") as handle:
            text = handle.read()
    except OSError:
        return ""
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return match.group(1) if match else ""


def main() -> int:
    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "os": os_release(),
        "arch": platform.machine(),
        "cuda": os.environ.get("CUDA_VERSION", ""),
        "python_packages": python_packages(),
        "apt_packages": apt_packages(),
    }
    print(json.dumps(out, sort_keys=True))
    folder = os.environ.get("IMAGETEST_OUT")
    if folder:
        with open(os.path.join(folder, "result.json.tmp"), "w") as handle:
            json.dump(out, handle, sort_keys=True)
        os.replace(os.path.join(folder, "result.json.tmp"), os.path.join(folder, "result.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
