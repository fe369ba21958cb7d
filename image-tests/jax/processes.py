"""What a run of jax_train.py tells, read from the files its processes write, not from output.

Each process writes process-<I>.start.json when it starts, process-<I>.json as it goes (the stage
it is in; at the end ok, its error and its findings) and process-<I>.fault when a fatal signal
kills it (jax aborts a process whose coordinator or peer is lost: SIGABRT, Python's faulthandler
names it). From these the cause is named: the failing process's own error, the signal that
killed it and the stage it was in, or the probe that hung and the stage every process was in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness import Probe, first_line, redirects


@dataclass
class Process:
    probe: Probe
    index: int
    started: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)   # process-<I>.json: the stage, then the end
    fault: str = ""

    @property
    def ok(self) -> bool:
        return self.probe.ok and bool(self.state.get("ok"))

    @property
    def completed(self) -> bool:
        """It ran to the end and wrote its findings; its checks may still have failed (jax_train.py
        exits non-zero then), which the tests judge one by one."""
        return bool(self.state.get("ended")) and self.state.get("error_type", "") in ("", "Failed") \
            and "identical" in self.state

    @property
    def stage(self) -> str:
        return str(self.state.get("stage") or ("start" if self.started else "not started"))


def read(probe: Probe, index: int) -> Process:
    found = Process(probe=probe, index=index)
    found.started = probe.json(f"process-{index}.start.json") or {}
    found.state = probe.json(f"process-{index}.json") or {}
    if probe.dir is not None:
        path = probe.dir / f"process-{index}.fault"
        if path.is_file():
            found.fault = first_line(path.read_text(errors="replace"))
    return found


def cause(process: Process, what: str) -> str:
    """One line naming why process `index` did not complete ('' when it did, whatever its checks say)."""
    probe, me = process.probe, process.index
    if process.completed and not probe.cut and not probe.error:
        return ""
    if probe.not_found or (probe.error and not probe.cut):
        return probe.cause()
    if process.state.get("ended") and process.state.get("error"):
        where = f" (at {process.state['where']})" if process.state.get("where") else ""
        return f"{what}: process {me} failed at {process.stage}: {process.state['error']}{where}"
    if process.fault:
        why = ""
        if process.stage == "initialize":   # jax aborts a process whose job did not form in time
            s = process.state
            why = (f" (jax aborts a process when not all {s.get('num_processes')} processes join the coordinator "
                   f"{s.get('coordinator')} within its init timeout of {s.get('init_timeout_s')} s; the join is a gRPC "
                   f"connection: {redirects('proxy', 'socket')})")
        return f"{what}: process {me} died at {process.stage}: {process.fault}{why}"
    if probe.cut:
        return f"{probe.hung()} (process {me} was at {process.stage})"
    if probe.signal:
        return f"{what}: process {me} was killed by {probe.cause().rsplit(' ', 1)[-1]} at {process.stage}"
    if probe.rc not in (0, None):
        return f"{what}: process {me} exited with {probe.rc} at {process.stage} without an error of its own"
    return f"{what}: process {me} wrote no findings (it was at {process.stage})"
