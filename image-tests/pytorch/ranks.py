"""What a torchrun probe tells, read from files, not from its output.

ddp_train.py and collectives.py write rank-<N>.start.json when a rank starts, rank-<N>.json
when it ends (ok, or the first line of its error and where it was raised) and rank-<N>.fault
when a fatal signal kills it (Python's faulthandler writes it). torchrun itself records an
error that stops it before or around the ranks (a rendezvous timeout, a store it cannot reach)
in TORCHELASTIC_ERROR_FILE as `{"message": {"message": "<ExceptionType>: ..."}}`. From these
the cause is named: the failing rank's own error line, a rank's fatal signal, or torchrun's
exception, by its type, never by words that some other failure could also print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from harness import Probe, first_line, free_port, redirects

LAUNCHER_ERROR_FILE = "launcher-error.json"
LAUNCHER_ENV = {"TORCHELASTIC_ERROR_FILE": "{out}/" + LAUNCHER_ERROR_FILE}
TIMEOUT_S = 60.0   # default for the ranks' rendezvous and collective timeout (target: ddp_timeout_s)
# Ranks may wait on each other that long without CPU or I/O before gloo or NCCL gives up with
# an error of its own (the cause a failure must name); the supervisor waits this much longer.
QUIET_MARGIN_S = 30.0
# torchrun exceptions that mean the nodes or ranks could not reach each other or the store.
NETWORK_ERRORS = frozenset({"DistNetworkError", "DistStoreError", "RendezvousConnectionError", "TimeoutError",
                            "ConnectionError", "ConnectionRefusedError", "socket.timeout", "gaierror"})
RENDEZVOUS_TIMEOUT = "RendezvousTimeoutError"
# A rank's error about a connection (gloo's "connectFullMesh failed ... timed out connecting", a store it
# cannot reach): its message then also names what in the image's environment could have redirected it.
CONNECTION_ERROR = re.compile(r"connect|timed out|timeout|unreachable|refused", re.IGNORECASE)


@dataclass
class Ranks:
    started: dict[str, dict[str, Any]] = field(default_factory=dict)
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: dict[str, str] = field(default_factory=dict)
    launcher_type: str = ""        # the exception type torchrun recorded, "" when none
    launcher_error: str = ""       # its first line

    @property
    def failed(self) -> dict[str, dict[str, Any]]:
        return {r: e for r, e in self.ended.items() if not e.get("ok")}


def read(probe: Probe) -> Ranks:
    ranks = Ranks()
    for name, data in probe.jsons("rank-*.json").items():
        rank = name.removeprefix("rank-").split(".")[0]
        (ranks.started if name.endswith(".start.json") else ranks.ended)[rank] = data
    if probe.dir is not None:
        for path in sorted(probe.dir.glob("rank-*.fault")):
            text = path.read_text(errors="replace").strip()
            if text:
                ranks.faults[path.name.removeprefix("rank-").split(".")[0]] = first_line(text)
    launcher = probe.json(LAUNCHER_ERROR_FILE) or {}
    message = str((launcher.get("message") or {}).get("message") or "") if isinstance(launcher, dict) else ""
    if message:
        kind, _, rest = message.partition(": ")
        ranks.launcher_type = kind.strip()
        ranks.launcher_error = f"{kind.strip()}: {first_line(rest)}" if rest else kind.strip()
    return ranks


def cause(probe: Probe, what: str, addr: str = "") -> str:
    """One line naming why a torchrun probe failed ('' when it did not)."""
    if probe.not_found or (probe.error and not probe.cut):
        return probe.cause()
    ranks = read(probe)
    if ranks.failed:
        rank, entry = sorted(ranks.failed.items(), key=lambda kv: kv[0])[0]
        others = f" (ranks failing: {', '.join(sorted(ranks.failed))})" if len(ranks.failed) > 1 else ""
        where = f" (at {entry['where']})" if entry.get("where") else ""
        hint = f"; {redirects('socket', 'proxy')}" if CONNECTION_ERROR.search(str(entry.get("error"))) else ""
        return f"{what} failed: rank {rank}: {entry.get('error')}{where}{others}{hint}"
    if ranks.faults:
        rank, line = sorted(ranks.faults.items())[0]
        return f"{what} failed: rank {rank} died: {line}"
    if not ranks.started and ranks.launcher_type:
        if ranks.launcher_type in NETWORK_ERRORS:
            return (f"{what}: the ranks could not reach each other through {addr or 'the rendezvous endpoint'}: "
                    f"torchrun {ranks.launcher_error} (check MASTER_ADDR, the network, and that the port is open "
                    f"between ranks; {redirects('socket', 'proxy')})")
        return f"{what}: torchrun failed before any rank started: {ranks.launcher_error}"
    if probe.cut:
        done = sorted(r for r, e in ranks.ended.items() if e.get("ok"))
        return (f"{probe.hung()} (ranks started: {', '.join(sorted(ranks.started)) or 'none'}; "
                f"finished: {', '.join(done) or 'none'})")
    if probe.rc not in (0, None):
        silent = sorted(set(ranks.started) - set(ranks.ended))
        if silent:
            return (f"{what} failed: rank {', '.join(silent)} ended without an error of its own "
                    f"(torchrun exit {probe.rc}; {ranks.launcher_error or 'no error recorded by torchrun'})")
        return f"{what} failed: torchrun exit {probe.rc}; {ranks.launcher_error or 'no error recorded'}"
    return ""


def one_rank(found: dict[str, Any]) -> bool:
    """Whether `run_in_main` ran one rank: a runner with exactly one GPU (one rank per GPU, NCCL). Gloo on CPU
    always runs two."""
    return int(found.get("nproc") or 0) < 2


def one_rank_why(what: str) -> str:
    """The reason a check whose point is data moving between ranks skips (one-gpu-on-runner) after one rank."""
    return (f"one GPU on this runner: torchrun ran one rank, so no data moved between ranks and {what} was not "
            "shown (not run, not passed); validate on a runner with two or more GPUs")


def timeout_s(target: dict[str, Any]) -> float:
    """The ranks' rendezvous and collective timeout."""
    return float(target.get("ddp_timeout_s", TIMEOUT_S))


def run_in_main(main: Any, target: dict[str, Any], runner_gpus: list[Any], script: str, name: str,
                env: dict[str, str]) -> dict[str, Any]:
    """torchrun of /imagetests/`script` in the main container (one rank per GPU, or two with gloo; a static
    rendezvous at the target's master address). Fails naming the cause (a rank's own error line, torchrun's), and
    when the ranks used another backend than NCCL on GPUs or gloo on CPU; returns rank 0's result.json with `nproc`."""
    nproc = len(runner_gpus) if runner_gpus else 2
    port = free_port()
    addr = f"{target.get('ddp_master_addr', '127.0.0.1')}:{port}"
    timeout = timeout_s(target)
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "static",
           "--master-addr", addr.split(":")[0], "--master-port", str(port),
           "--rdzv-conf", f"timeout={int(timeout)}", f"/imagetests/{script}"]
    what = f"torchrun {name} ({nproc} ranks)"
    probe = main.run(cmd, step=what, quiet=timeout + QUIET_MARGIN_S, env={**env, **LAUNCHER_ENV})
    why = cause(probe, what, addr)
    assert not why, why
    found = probe.result
    assert probe.ok and isinstance(found, dict), f"{what}: rank 0 wrote no result ({probe.cause()})"
    # NCCL on the runner's GPUs, gloo on CPU: ranks that fell back to gloo on a GPU runner (torch in the image saw no
    # GPU) still train, agree and measure a table; none of that is the GPU run the checks report.
    want = "nccl" if runner_gpus else "gloo"
    if found.get("backend") != want:
        why = (f": torch in the image saw no GPU (torch.cuda.is_available() was False), so the ranks ran on the CPU "
               f"instead of the runner's {nproc} GPUs" if runner_gpus else "")
        raise AssertionError(f"{what}: the ranks used {found.get('backend') or 'no backend they recorded'}, not "
                             f"{want}{why}")
    found["nproc"] = nproc
    return found
