"""The locked packages ship valid bytecode, so no process of the image compiles them again.

Without it every process that imports the framework compiles its modules in memory first: `import torch`
took 3.7-4.0 s in a fresh container without bytecode and 1.7-1.9 s with (2 cores here), paid by every rank,
DataLoader worker (spawn) and TensorBoard a user starts. The build writes checked hash-based bytecode
(templates/parts/uv.j2); a derived image that deletes __pycache__, or edits a source after the build, loses
it for those files, and this names them.
"""

from __future__ import annotations

import json

import pytest
from harness import skip

from buildtool.contracts import label_keys, skips

pytestmark = pytest.mark.shared(why="reads the image's files")

SHOWN = 5


def test_locked_packages_load_from_precompiled_bytecode(main, target):
    locked = target["expect"].get("locked")
    if locked is None:
        # A skip the release gate refuses: such an image is never released.
        skip(skips.NO_LOCK_LABEL, f"the image has no {label_keys.PACKAGES} label, so nothing says which packages "
             "its locks installed; build it with `buildtool build`")
    found = main.result("bytecode.py", json.dumps(sorted(locked)), step="check the locked packages' bytecode")
    assert not found["distributions_missing"], (
        f"locked packages not installed: {', '.join(found['distributions_missing'])}")
    assert found["checked"] > 0, "the locked packages list no Python files: nothing was checked"
    bad = {"no bytecode": found["missing"], "bytecode that does not match its source": found["stale"]}
    problems = [f"{len(paths)} of {found['checked']} Python files of the locked packages have {what} "
                f"(e.g. {', '.join(paths[:SHOWN])}): every process compiles them again on import"
                for what, paths in bad.items() if paths]
    assert not problems, "; ".join(problems)
