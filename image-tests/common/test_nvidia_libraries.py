"""The cuDNN and NCCL in the image are the ones its base promises (an NGC release's notes, recorded
in the matrix as `libraries`): an NGC tag re-pushed with other libraries, or an image that put its
own in front of them, is caught here, on CPU runners too (the version calls need no GPU)."""

from __future__ import annotations

import json

import pytest
from harness import skip

from buildtool.contracts import nvlibs, skips

pytestmark = pytest.mark.shared(why="reads the image's libraries")


def test_nvidia_libraries_are_the_ones_the_base_promises(main, target):
    promised = target["expect"].get("libraries") or {}
    if not promised:
        skip(skips.NO_LIBRARY_PROMISE, f"the matrix records no cuDNN or NCCL for {target['cell']}'s base")
    if target["expect"].get("standin"):
        skip(skips.STANDIN_LIBRARIES, f"not run: a stand-in image carries none of the NVIDIA libraries "
                                      f"{target['cell']}'s base promises")
    spec = {"module": target["framework_info"]["module"],
            "libraries": {name: nvlibs.soname(name, version) for name, version in sorted(promised.items())}}
    found = main.result("nvlibs.py", json.dumps(spec), step="read the versions of the image's cuDNN and NCCL")
    source = target["expect"].get("libraries_source") or "the matrix"
    problems = []
    for name, version in sorted(promised.items()):
        seen = found["libraries"].get(name) or {"missing": "not looked up"}
        if "missing" in seen:
            problems.append(f"no {nvlibs.LIBRARIES[name].title} {version}: {seen['missing']}")
            continue
        wrong = nvlibs.problem(name, version, int(seen["code"]))
        if wrong:
            problems.append(f"{wrong}; loaded from {seen['path']}")
    assert not problems, (f"the image's NVIDIA libraries are not the ones {target['cell']}'s base promises: "
                          f"{'; '.join(problems)} (matrix `libraries`, from {source}; if NVIDIA's page lists "
                          "what the image has, correct the matrix)")
