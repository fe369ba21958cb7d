"""The verdict: what validate says about one image digest, and what release and report read.

Typed here once; `validate` builds it, the registry stores it by digest, `release` gates on
it and `report` shows it. Schema 2 records what a reader needs to trust a `passed`: the tests
the cell's groups define, which of them a selection removed, and the runner's GPUs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = 2
Result = Literal["passed", "failed", "incomplete"]
TestOutcome = Literal["passed", "failed", "skipped"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TestResult(_Model):
    id: str                      # `<group>/<file>::<test>[param]`, relative to image-tests/, never to a rootdir
    group: str                   # the image-tests group (first path part of the id)
    result: TestOutcome
    duration_s: float = 0.0
    message: str = ""            # first line: the cause, as the console prints it
    skip_code: str = ""          # contracts.skips code of a skip ("" when the skip carried none)
    skip_subject: str = ""
    skip_reason: str = ""        # the skip's text, without its code
    gpu: bool = False            # marked `gpu`: it needs a GPU to run


class Gpu(_Model):
    index: str
    name: str
    driver: str = ""
    memory_mib: int | None = None


class Runner(_Model):
    hostname: str
    gpu_runner: bool = False         # declared a GPU runner (--require-gpu or DL_IMAGES_REQUIRE_GPU)
    gpus: list[Gpu] = Field(default_factory=list)
    driver: str = ""                 # NVIDIA driver version
    cuda_driver: str = ""            # CUDA version the driver supports
    gpu_problem: str = ""            # why GPUs could not be used, when they could not


class Selection(_Model):
    expression: str | None = None    # pytest -k, when one was given
    deselected: list[str] = Field(default_factory=list)


class Verdict(_Model):
    schema_: Literal[2] = Field(2, alias="schema")
    digest: str
    image: str
    cell: str
    result: Result
    started: str
    duration_s: float
    test_code: str                   # sha256 over image-tests/
    runner: Runner
    groups: list[str]
    defined_tests: list[str]         # every test the cell's groups define, before any selection
    selection: Selection = Field(default_factory=Selection)
    run_flags: list[str] = Field(default_factory=list)
    pytest_exit: int
    tests: list[TestResult]
    figures: dict[str, Any] = Field(default_factory=dict)
    problem: str = ""                # why the run did not end by itself (deadline ran out, interrupted)
    deadline_s: float = 0.0          # the image's validation deadline (matrix validate.deadline_s or --deadline)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def counts(self) -> dict[str, int]:
        return {k: sum(t.result == k for t in self.tests) for k in ("passed", "failed", "skipped")}
