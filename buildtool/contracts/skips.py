"""Why a test may be skipped, as codes: image tests emit them, the release gate judges them.

A skip message is `[code] text` or `[code:subject] text` (the subject, e.g. a ulimit's name,
lets the gate check the matrix). The gate never reads the text: it asks the code's rule
whether the matrix says the test cannot apply to this cell (`expected`), whether a releaser
may waive it by name for a runner's limits (`waivable`), or neither (`refused`). A skip
without a known code is refused.

Each code also says which tests may carry it (`gpu_only`: tests marked `gpu`; `tests`: test ids
of image-tests/, `file.py` for every test of a file, `file.py::name` for one test and its
parameters). A code on any other test is refused whatever the cell (`allows`): a gloo DDP test
skipped with `gpu-not-in-cell` is a test that did not run, not one the matrix excuses.
tests/test_skip_codes.py checks that every image test emits each code only where it may.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

Judgement = Literal["expected", "waivable", "refused"]


class _Run(Protocol):
    @property
    def gpus(self) -> str: ...


class SkipCell(Protocol):
    """What a skip rule reads of a cell: buildtool.matrix.schema.Cell satisfies it (contracts sit below
    the matrix stage and do not import it)."""

    @property
    def run(self) -> _Run: ...

    @property
    def needs_gpu(self) -> bool: ...

    @property
    def packages(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def libraries(self) -> object | None: ...


@dataclass(frozen=True)
class SkipCode:
    code: str
    meaning: str
    # True when the matrix confirms the test cannot apply to this cell (None: never).
    expected_for: Callable[[SkipCell, str], bool] | None = None
    waivable: bool = False   # a runner's limitation the releaser may accept by name (--accept-skip)
    gpu_only: bool = False   # only tests marked `gpu` may carry it
    tests: tuple[str, ...] = ()   # the only tests that may carry it (`file.py` or `file.py::name`); () = any

    def allows(self, test_id: str, gpu: bool) -> bool:
        """Whether the test `test_id` (marked gpu or not) may be skipped with this code."""
        if self.gpu_only and not gpu:
            return False
        if not self.tests:
            return True
        file, _, name = test_id.partition("::")
        function = name.split("[", 1)[0]
        return any(allowed in (file, f"{file}::{function}") for allowed in self.tests)

    def who(self) -> str:
        """Which tests may carry the code, for a message."""
        parts = ["tests marked gpu"] if self.gpu_only else []
        if self.tests:
            parts.append(", ".join(self.tests))
        return " among ".join(parts) or "any test"


GPU_NOT_IN_CELL = SkipCode("gpu-not-in-cell", "GPU check on a cell whose run profile has no GPUs",
                           lambda cell, _s: cell.run.gpus == "none" and not cell.needs_gpu, gpu_only=True)
NO_GPU_ON_RUNNER = SkipCode("no-gpu-on-runner", "GPU check of a GPU cell on a runner without usable GPUs",
                            gpu_only=True)
# The checks whose point is data moving between ranks: on one GPU they ran one rank (an all_reduce returns its input,
# one hash is identical to itself), so they skip as not run. Not gpu_only: DDP's and FSDP's checks also run on CPU
# with gloo (two ranks, never skipped); the release gate's one-GPU pairing needs each passed on two or more GPUs.
ONE_GPU_ON_RUNNER = SkipCode(
    "one-gpu-on-runner", "multi-GPU check (data moving between ranks) on a runner with one GPU",
    tests=("pytorch/test_ddp.py::test_ddp_nccl_allreduce_busbw", "pytorch/test_ddp.py::test_ddp_ranks_end_identical",
           "pytorch/test_fsdp.py::test_fsdp_shards_gather_the_same_parameters_on_every_rank",
           "pytorch/test_fsdp.py::test_fsdp_gradient_reduction_matches_unsharded_training",
           "pytorch/test_fsdp.py::test_fsdp_loss_falls",
           "pytorch/test_collectives.py::test_collectives_give_known_results_with_nccl",
           "jax/test_distributed.py::test_nccl_across_all_gpus"))
ULIMIT_NOT_GRANTED = SkipCode("ulimit-not-granted", "the engine cannot grant a ulimit of the run profile",
                              waivable=True, tests=("common/test_run_profile.py::test_ulimit",))
NO_PINNED_PACKAGES = SkipCode("no-pinned-packages", "the cell pins no extra packages",
                              lambda cell, _s: not cell.packages,
                              tests=("common/test_contents.py::test_extra_packages",))
NO_PEER_IMAGE = SkipCode("no-peer-image", "no image of the other framework to exchange event files with",
                         waivable=True, tests=("common/test_cross_tensorboard.py",))
# The stand-in codes are never expected: the matrix gives every NGC cell a stand-in for CI, so "the cell has a
# stand-in" would excuse the check on the real NGC image too (issue 48), and a stand-in image is never released.
STANDIN_PYTHON = SkipCode("standin-python", "a stand-in image's Python comes from the stand-in base",
                          tests=("common/test_contents.py::test_python_version",))
NO_LIBRARY_PROMISE = SkipCode("no-library-promise", "the cell's base promises no cuDNN or NCCL version",
                              lambda cell, _s: cell.libraries is None,
                              tests=("common/test_nvidia_libraries.py",))
STANDIN_LIBRARIES = SkipCode("standin-libraries", "a stand-in image carries none of the NVIDIA libraries of the "
                             "base it stands in for", tests=("common/test_nvidia_libraries.py",))
# Never expected, never waivable: an image that does not say what its locks installed is not released.
NO_LOCK_LABEL = SkipCode("no-lock-label", "the image has no label listing the packages its locks installed "
                         "(not built by `buildtool build` from locks)",
                         tests=("common/test_locked_packages.py::test_locked_packages_installed_at_their_versions",
                                "common/test_bytecode.py::test_locked_packages_load_from_precompiled_bytecode"))

CODES: dict[str, SkipCode] = {c.code: c for c in (
    GPU_NOT_IN_CELL, NO_GPU_ON_RUNNER, ONE_GPU_ON_RUNNER, ULIMIT_NOT_GRANTED,
    NO_PINNED_PACKAGES, NO_PEER_IMAGE, STANDIN_PYTHON, NO_LOCK_LABEL, NO_LIBRARY_PROMISE, STANDIN_LIBRARIES)}

# A skip's subject, as a waiver names it (`--accept-skip CODE:SUBJECT`) and a skip message carries it.
_SUBJECT = r"[A-Za-z0-9_.-]+"
WAIVER_RE = re.compile(rf"^(?P<code>[a-z0-9-]+)(?::(?P<subject>{_SUBJECT}))?\Z")


def parse_waiver(text: str) -> tuple[str, str]:
    """`--accept-skip CODE[:SUBJECT]` -> (code, subject): a code the contract marks waivable, by its name, and
    optionally the one subject it waives (`ulimit-not-granted:memlock`). A waiver names a code; it is never
    matched against a skip's prose (a reason that mentions another code waives nothing). ValueError naming
    what is wrong (not a code, unknown, not waivable)."""
    match = WAIVER_RE.fullmatch(text)
    waivable = ", ".join(c.code for c in CODES.values() if c.waivable)
    if not match:
        raise ValueError(f"not a skip code (CODE or CODE:SUBJECT; waivable codes: {waivable})")
    code, subject = match.group("code"), match.group("subject") or ""
    rule = CODES.get(code)
    if rule is None:
        raise ValueError(f"no such skip code (waivable codes: {waivable})")
    if not rule.waivable:
        raise ValueError(f"{code} cannot be waived ({rule.meaning}); waivable codes: {waivable}")
    return code, subject


def waives(waiver: str, code: str, subject: str) -> bool:
    """Whether `--accept-skip waiver` waives a skip with this code and subject: the code by name, and the
    subject when the waiver names one. A waiver that does not parse waives nothing."""
    try:
        want, only = parse_waiver(waiver)
    except ValueError:
        return False
    return want == code and (not only or only == subject)


_TEXT_RE = re.compile(r"^\[(?P<code>[a-z0-9-]+)(?::(?P<subject>[^\]]*))?\]\s*(?P<text>.*)$", re.DOTALL)


def skip_text(code: SkipCode, text: str, subject: str = "") -> str:
    """The message a test skips with. ValueError for a subject no waiver can name (`a]b` would also not read back)."""
    if subject and not re.fullmatch(_SUBJECT, subject):
        raise ValueError(f"skip subject {subject!r} is not one a waiver can name ({_SUBJECT}, e.g. memlock)")
    return f"[{code.code}{':' + subject if subject else ''}] {text}"


def parse_skip(message: str) -> tuple[str, str, str]:
    """(code, subject, text) of a skip message; code '' when it carries none."""
    match = _TEXT_RE.match(message.strip())
    if not match:
        return "", "", message.strip()
    return match.group("code"), match.group("subject") or "", match.group("text")


def misplaced(code: str, test_id: str, gpu: bool) -> str | None:
    """Why test `test_id` may not carry `code` (None: it may, or the code is unknown: `judge` refuses it)."""
    rule = CODES.get(code)
    if rule is None or rule.allows(test_id, gpu):
        return None
    return (f"{test_id} is skipped with [{code}]: this test may not carry it (only {rule.who()} may"
            + (")" if gpu or not rule.gpu_only else "; it is not marked gpu)"))


def judge(cell: SkipCell, code: str, subject: str = "", test_id: str | None = None, gpu: bool = False) -> Judgement:
    """The code's rule for this cell; with `test_id`, `refused` also when that test may not carry it."""
    rule = CODES.get(code)
    if rule is None:
        return "refused"
    if test_id is not None and not rule.allows(test_id, gpu):
        return "refused"
    if rule.expected_for is not None and rule.expected_for(cell, subject):
        return "expected"
    return "waivable" if rule.waivable else "refused"
