"""Why a test may be skipped, as codes: image tests emit them, the release gate judges them.

A skip message is `[code] text` or `[code:subject] text` (the subject, e.g. a ulimit's name,
lets the gate check the matrix). The gate never reads the text: it asks the code's rule
whether the matrix says the test cannot apply to this cell (`expected`), whether a releaser
may waive it by name for a runner's limits (`waivable`), or neither (`refused`). A skip
without a known code is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from buildtool.matrix.schema import Cell

Judgement = Literal["expected", "waivable", "refused"]


@dataclass(frozen=True)
class SkipCode:
    code: str
    meaning: str
    # True when the matrix confirms the test cannot apply to this cell (None: never).
    expected_for: Callable[[Cell, str], bool] | None = None
    waivable: bool = False   # a runner's limitation the releaser may accept by name (--accept-skip)


def _cpu_cell(cell: Cell, _subject: str) -> bool:
    return cell.run.gpus == "none" and not cell.needs_gpu


GPU_NOT_IN_CELL = SkipCode("gpu-not-in-cell", "GPU check on a cell whose run profile has no GPUs", _cpu_cell)
NO_GPU_ON_RUNNER = SkipCode("no-gpu-on-runner", "GPU check of a GPU cell on a runner without usable GPUs")
ONE_GPU_ON_RUNNER = SkipCode("one-gpu-on-runner", "multi-GPU check (bus bandwidth) on a runner with one GPU")
ULIMIT_NOT_GRANTED = SkipCode("ulimit-not-granted", "the engine cannot grant a ulimit of the run profile",
                              waivable=True)
NO_PINNED_PACKAGES = SkipCode("no-pinned-packages", "the cell pins no extra packages",
                              lambda cell, _s: not cell.packages)
NO_PEER_IMAGE = SkipCode("no-peer-image", "no image of the other framework to exchange event files with",
                         waivable=True)
STANDIN_PYTHON = SkipCode("standin-python", "a stand-in image's Python comes from the stand-in base",
                          lambda cell, _s: cell.standin is not None)
# Never expected, never waivable: an image that does not say what its locks installed is not released.
NO_LOCK_LABEL = SkipCode("no-lock-label", "the image has no label listing the packages its locks installed "
                         "(not built by `buildtool build` from locks)")

CODES: dict[str, SkipCode] = {c.code: c for c in (
    GPU_NOT_IN_CELL, NO_GPU_ON_RUNNER, ONE_GPU_ON_RUNNER, ULIMIT_NOT_GRANTED,
    NO_PINNED_PACKAGES, NO_PEER_IMAGE, STANDIN_PYTHON, NO_LOCK_LABEL)}

_TEXT_RE = re.compile(r"^\[(?P<code>[a-z0-9-]+)(?::(?P<subject>[^\]]*))?\]\s*(?P<text>.*)$", re.DOTALL)


def skip_text(code: SkipCode, text: str, subject: str = "") -> str:
    """The message a test skips with."""
    return f"[{code.code}{':' + subject if subject else ''}] {text}"


def parse_skip(message: str) -> tuple[str, str, str]:
    """(code, subject, text) of a skip message; code '' when it carries none."""
    match = _TEXT_RE.match(message.strip())
    if not match:
        return "", "", message.strip()
    return match.group("code"), match.group("subject") or "", match.group("text")


def judge(cell: Cell, code: str, subject: str = "") -> Judgement:
    rule = CODES.get(code)
    if rule is None:
        return "refused"
    if rule.expected_for is not None and rule.expected_for(cell, subject):
        return "expected"
    return "waivable" if rule.waivable else "refused"
