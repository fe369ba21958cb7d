"""The target file: what `buildtool validate` tells image-tests about the image under test.

Written by validate (buildtool.validate.runner), read by image-tests/conftest.py through
`load_target`, so both sides agree on every field. Image tests read it as a plain dict
(`target["framework"]`); the model is what makes a missing or misspelt field an error at
the start of the run instead of a KeyError in the middle of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FrameworkClaim(_Strict):
    source: str                  # where the claim comes from ("matrix cell ...", "label ...")
    value: str
    note: str = ""
    # The local version part the cell's build reports (contracts.versions.Expectation): a regex
    # over what follows `+` ("" = none) and how to say it in a message.
    local_pattern: str = ""
    local_text: str = "no local part"
    source_dev: bool = False     # a .devN of the claimed release passes (Expectation.source_dev)


class LabelCheck(_Strict):
    """One label of the image, what the matrix cell says it must be, and what in the image proves it."""

    key: str
    value: str | None            # what the image's label says (None: the image lacks it)
    cell_value: str | None = None  # what the matrix cell's rendered Dockerfile says (None: not a template label)
    fact: str = ""               # label_keys.FACTS kind checked inside the image ("" for none)
    expected: str = ""           # for fact "version": how to prove it ("framework-release" or "env:NAME")
    note: str = ""


class Expectations(_Strict):
    """What the image claims to contain: from its matrix cell and its labels."""

    packages: dict[str, str] = Field(default_factory=dict)
    standin: bool = False
    framework_claims: list[FrameworkClaim] = Field(default_factory=list)
    python: str = ""
    python_skip_reason: str = ""
    # name -> version of every package the cell's locks installed (the build's label); None: no label.
    locked: dict[str, str] | None = None
    labels: list[LabelCheck] = Field(default_factory=list)
    # NVIDIA library -> the version the cell's base promises (contracts.nvlibs), and the page saying so.
    libraries: dict[str, str] = Field(default_factory=dict)
    libraries_source: str = ""


class FrameworkInfo(_Strict):
    """The framework table's row, for scripts that run inside the image (no buildtool there)."""

    name: str
    module: str
    gpu_count_expr: str
    events_writer: list[str]
    shm_workers: str = "python"
    cuda_build_expr: str = "''"
    container_version_env: str = ""


class Target(_Strict):
    image: str                   # what containers start from (repo@digest when in a registry)
    ref: str                     # what the user named
    digest: str
    cell: str
    framework: str
    framework_info: FrameworkInfo
    peer_frameworks: dict[str, FrameworkInfo] = Field(default_factory=dict)
    accelerator: str
    needs_gpu: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    image_env: dict[str, str] = Field(default_factory=dict)     # the image config's Env (as the engine reports it)
    run_flags: list[str]
    ulimits: dict[str, int] = Field(default_factory=dict)
    ulimits_not_granted: list[str] = Field(default_factory=list)
    extra_run_flags: list[str] = Field(default_factory=list)    # fault injection (toolkit's own tests)
    peer_run_flags: list[str] = Field(default_factory=list)
    shm_promised: str
    shm_expected_bytes: int
    shm_fix: str = ""            # where the promise is made ("run.shm_size of pytorch-cpu in matrix.yaml (line 9)")
    expect: Expectations
    # GPUs the tests may use: the runner's, when this cell's containers can be given them (empty
    # for CPU cells and on runners without usable GPUs; gpu_problem then says why, when it is known).
    runner_gpus: list[dict[str, str]] = Field(default_factory=list)
    gpu_problem: str = ""
    cuda: str = ""                                # the cell's CUDA (GPU cells)
    busbw_floor_GBps: float | None = None         # contracts.busbw's floor for the runner's GPU model and link
    busbw_floor_model: str = ""                   # the model nvidia-smi's name normalised to ("H100 SXM")
    busbw_interconnect: str = ""                  # NVLink or PCIe (nvidia-smi topo -m); "" unknown
    busbw_floor_note: str = ""                    # how the floor was set, or why there is none
    busbw_floor_source: str = ""                  # the documented figure it comes from
    busbw_floor_fault: str = ""                   # why the check fails whatever it measures (NVLink down, ...)
    busbw_baseline: dict[str, Any] = Field(default_factory=dict)   # median of earlier nights (same cell, GPUs)
    rdzv_join_timeout_s: float = 900.0
    missing_peer_timeout_s: float = 5.0
    ddp_master_addr: str = "127.0.0.1"
    ddp_timeout_s: float = 120.0
    peers: dict[str, str] = Field(default_factory=dict)
    run_id: str
    # The bridge network validate made for this run (buildtool.validate.network): the checks across nodes
    # start their containers on it, each in a network namespace of its own; "" without validate.
    network: str = ""
    deadline_s: float = 0.0      # the image's whole validation deadline (matrix validate.deadline_s or --deadline)
    probe_budget_s: float = 0.0  # what is left of it for the tests when pytest starts; every probe is cut to it
    # How many times slower than native the image's processes run: validate.emulation_factor under QEMU, else 1.
    # The probes' own fixed bounds (a TensorBoard answering) stretch by it, as the deadline does.
    slowdown: int = 1


def write_target(path: Path, target: Target) -> None:
    path.write_text(json.dumps(target.model_dump(mode="json"), indent=1))


def load_target(path: Path) -> dict[str, Any]:
    """Read and check a target file; returns it as a plain dict for the tests."""
    return Target.model_validate_json(path.read_text()).model_dump(mode="json")
