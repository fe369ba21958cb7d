"""Tracked containers for image tests, and probes run in them with bounded time and structured results.

A container is started detached from the cell's run profile, through the image's own
entrypoint (as `docker run IMAGE CMD` is), and always removed: on errors, Ctrl-C and SIGTERM
too. Nothing is installed into the image: image-tests/scripts, with the scripts of the image's
framework (image-tests/<framework>/scripts) beside them, is mounted read-only at /imagetests, and a
host folder at /imagetests-out receives what probes write.

A probe is one command run with `docker exec` as the image's default user in its working
directory, under scripts/supervise.py (`python3 -I -S`: no site, no sitecustomize), which records
how it ended in a JSON file. The command writes its findings as JSON into its own folder
($IMAGETEST_OUT). Nothing is decided from text a process prints, so banners, a motd, BASH_ENV or
an entrypoint that talks cannot change a result; no login shell is ever started.

Slow is not hung. A probe may run as long as what is left of the image's deadline
(`buildtool validate` sets it from the matrix) while it makes progress (its processes' CPU time,
page faults or I/O grow); it is cut as hung when none of that has grown for its quiet window
(QUIET_S, or longer where the probe legitimately waits: a peer, a timeout of its own). So a cold
page cache, which makes the first `import tensorflow` read for most of a minute, passes, and an
import that blocks forever fails as "<step> hung: no CPU or I/O for 30 s" long before the
deadline. A probe without the image's deadline (image-tests started without `buildtool validate`)
is refused, never run unbounded. The framework is imported once per image, first (`warm_up`), and its cold import time
and bytes read go into the verdict.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from buildtool.common import docker_cli
from buildtool.common.net import free_port  # noqa: F401  (image tests import it from here)
from buildtool.contracts import label_keys, skips

TESTS_DIR = Path(__file__).resolve().parent
SCRIPTS = TESTS_DIR / "scripts"
SCRIPTS_IN = "/imagetests"
OUT_IN = "/imagetests-out"
SHARED_IN = "/shared"
RUN_LABEL = label_keys.IMAGETEST_RUN
# The host waits this much longer than a probe's bound: the supervisor needs a few seconds
# to kill the probe (SIGTERM, then SIGKILL) and to write down how it ended.
HOST_GRACE_S = 20.0
# A probe with no CPU, page fault or I/O progress for this long has hung. A cold disk still
# makes progress (bytes read grow); waits on a peer or on a timeout of the probe's own get a
# longer window from their caller.
QUIET_S = 30.0
START_TIMEOUT_S = 180.0
_LIVE: set[str] = set()


# -- the image's deadline ---------------------------------------------------------------------


@dataclass
class Deadline:
    """The whole image's time budget: every probe's timeout is cut to what is left of it."""

    total_s: float = 0.0           # the image's deadline as declared (0: none)
    ends_at: float = 0.0           # time.monotonic() when the tests must stop (teardown fits after it)
    spent_by: str = ""             # the step that ran into it

    def left(self) -> float:
        return self.ends_at - time.monotonic() if self.ends_at else float("inf")

    def spent(self) -> bool:
        return bool(self.ends_at) and self.left() <= 0

    def describe(self) -> str:
        if not self.ends_at:
            return ("no deadline was set for the image: image-tests run under `buildtool validate`, which sets it "
                    "from validate.deadline_s in the matrix")
        by = f" ({self.spent_by} ran into it)" if self.spent_by else ""
        return f"the image's validation deadline of {self.total_s:.0f}s is spent{by}"

    def describe_total(self) -> str:
        return f"validate.deadline_s {self.total_s:.0f} s" if self.total_s else "no deadline was set"

    def bound(self) -> float:
        """What a probe starting now may use: what is left before the tests must stop (0 without a
        deadline: a probe is never unbounded, it is refused)."""
        return self.left() if self.ends_at else 0.0


DEADLINE = Deadline()
# How many times slower than native the image runs (the target's slowdown: QEMU); the probes read it as
# $IMAGETEST_SLOWDOWN and stretch their own fixed bounds by it.
SLOWDOWN = 1


def set_deadline(budget_s: float, total_s: float = 0.0) -> None:
    """The tests may run `budget_s` more seconds, of the image's `total_s` deadline (0: no deadline)."""
    DEADLINE.total_s = float(total_s or budget_s)
    DEADLINE.ends_at = time.monotonic() + float(budget_s) if budget_s else 0.0
    DEADLINE.spent_by = ""


# -- what could redirect a local connection ---------------------------------------------------

# Variables that send a connection somewhere other than the address it names: socket interfaces
# (gloo, NCCL, TensorPipe bind and advertise the address of the interface named), and proxies
# (urllib, requests and gRPC, which jax.distributed's coordinator uses, send through them whatever
# no_proxy does not cover).
SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
              "GRPC_PROXY")
NO_PROXY_VARS = ("no_proxy", "NO_PROXY", "no_grpc_proxy")
REDIRECTS = {"socket": SOCKET_VARS, "proxy": (*PROXY_VARS, *NO_PROXY_VARS)}
# What the containers of the image get: its config's Env, then what the run flags add (conftest sets it).
IMAGE_ENV: dict[str, str] = {}


def set_image_env(image_env: dict[str, str], run_flags: list[str]) -> None:
    """The environment every process of the image's containers starts with: the image's Env, then the
    `-e NAME=VALUE` / `--env=NAME=VALUE` of the run flags."""
    env = dict(image_env)
    flags = list(run_flags)
    for i, flag in enumerate(flags):
        value = flags[i + 1] if flag in ("-e", "--env") and i + 1 < len(flags) else \
            flag.split("=", 1)[1] if flag.startswith("--env=") else ""
        if "=" in value:
            name, _, setting = value.partition("=")
            env[name] = setting
    IMAGE_ENV.clear()
    IMAGE_ENV.update(env)


def shown(value: str) -> str:
    """A variable's value for a message: a URL's password masked (`http://user:***@proxy:3128`), a user name given
    alone (a token: `http://TOKEN@proxy`) too, with or without a scheme. Everything up to the last `@` is userinfo:
    a password may hold an unescaped `@` or `/`."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    userinfo, at, location = rest.rpartition("@")
    if not at:
        return value
    user, _, password = userinfo.partition(":")   # `TOKEN:@proxy`: no password, the user name is the token
    return f"{scheme}{sep}{user}:***@{location}" if password else f"{scheme}{sep}***@{location}"


def redirects(*kinds: str, env: dict[str, str] | None = None) -> str:
    """For a message about a local connection that failed: the variables of the image's environment that
    could have redirected it, with their values, or that none of them is set."""
    env = IMAGE_ENV if env is None else env
    names = [name for kind in kinds for name in REDIRECTS[kind]]
    found = [f"{name}={shown(env[name])}" for name in names if name in env]
    if found:
        return "the image's environment could redirect it: " + ", ".join(found)
    said = [name for name in names if not name.isupper() or name in SOCKET_VARS]   # proxies: lower case stands for both
    upper = ", upper case too" if "proxy" in kinds else ""
    return f"no variable that could redirect it is set ({', '.join(said)}{upper})"


def docker_lines(*args: str, timeout: float = 60) -> list[str]:
    """The lines a docker command prints ([] when it fails)."""
    proc = _docker(*args, timeout=timeout)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


# -- probes -----------------------------------------------------------------------------------


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


@dataclass
class Probe:
    """How one probe ended, and what it wrote."""

    step: str                      # what it does, in words ("import torch and read versions")
    argv: list[str]
    quiet: float = QUIET_S         # seconds with no progress after which it is hung
    bound: float = 0.0             # the seconds it was allowed: what was left of the image's deadline
    rc: int | None = None
    signal: int | None = None
    stalled: bool = False          # killed: no CPU or I/O for `quiet` seconds
    timed_out: bool = False        # killed: still making progress when the deadline ran out
    lost: bool = False             # the supervisor itself gave no record (the host killed it)
    not_found: bool = False
    seconds: float = 0.0
    cpu_s: float = 0.0             # CPU time of its processes
    read_bytes: int = 0            # bytes its processes read from storage (page cache misses)
    error: str = ""                # why it could not run at all (from the supervisor or the engine)
    result: Any = None             # the probe's own result.json
    out: str = ""                  # output tails: for people, never parsed
    err: str = ""
    dir: Path | None = None        # its folder on the host (rank files and the like)
    files: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.out + self.err

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.cut and not self.error

    @property
    def cut(self) -> bool:
        """It did not end by itself: hung, out of deadline, or lost."""
        return self.stalled or self.timed_out or self.lost

    def tail(self, lines: int = 12) -> str:
        text = (self.out + "\n" + self.err).strip()
        return "\n".join(text.splitlines()[-lines:])

    def json(self, name: str) -> Any:
        """Another JSON file the probe wrote into its folder (None when absent or unreadable)."""
        if self.dir is None:
            return None
        try:
            return json.loads((self.dir / name).read_text())
        except (OSError, ValueError):
            return None

    def read_record(self, host_dir: Path) -> bool:
        """Take in what the supervisor and the probe wrote into `host_dir`: how it ended (exit.json), its
        output tails and its result.json. False when the supervisor left no record."""
        self.dir = host_dir
        self.out, self.err = _read(host_dir / "stdout"), _read(host_dir / "stderr")
        self.result = _json(host_dir / "result.json")
        record = _json(host_dir / "exit.json")
        if record is None:
            return False
        try:   # written in the image under test, by its own Python: an object of numbers, or named
            seconds, cpu_s = float(record.get("seconds") or self.seconds), float(record.get("cpu_s") or 0)
            read_bytes = int(record.get("read_bytes") or 0)
        except (AttributeError, TypeError, ValueError):
            self.error = f"the supervisor's exit.json is no record of how the probe ended: {json.dumps(record)[:200]}"
            return True
        self.rc, self.signal = record.get("rc"), record.get("signal")
        self.stalled, self.timed_out = bool(record.get("stalled")), bool(record.get("timed_out"))
        self.not_found = bool(record.get("not_found"))
        self.seconds, self.cpu_s, self.read_bytes = seconds, cpu_s, read_bytes
        self.error = record.get("error") or ""
        return True

    def jsons(self, pattern: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.dir is not None:
            for path in sorted(self.dir.glob(pattern)):
                with contextlib.suppress(OSError, ValueError):
                    found[path.name] = json.loads(path.read_text())
        return found

    def hung(self) -> str:
        """One line on why it was cut: hung (no progress), slow (the deadline ran out while it
        still made progress), or lost (not even the supervisor answered)."""
        if self.stalled:
            return f"{self.step} hung: no CPU or I/O for {self.quiet:.0f} s; killed after {self.seconds:.0f} s"
        if self.timed_out:
            return (f"{self.step}: still running after {self.seconds:.0f} s ({megabytes(self.read_bytes)} read, "
                    f"{self.cpu_s:.0f} s of CPU): the image's deadline ran out ({DEADLINE.describe_total()})")
        return (f"{self.step} hung: not even its supervisor answered within {self.bound + HOST_GRACE_S:.0f} s; "
                f"killed")

    def cause(self) -> str:
        """One line: why it failed (the first line a console prints must carry it)."""
        if self.error:
            return f"{self.step}: {self.error}"
        if self.cut:
            return self.hung()
        if isinstance(self.result, dict) and self.result.get("error"):
            return f"{self.step}: {self.result['error']}"
        if self.signal:
            return f"{self.step} was killed by {signal_name(self.signal)}"
        if self.rc not in (0, None):
            last = last_line(self.err) or last_line(self.out) or "no output"
            return f"{self.step} exited with {self.rc}: {last[:300]}"
        if self.result is None:
            return f"{self.step} wrote no result"
        return ""


def check_client_setting() -> None:
    """The docker client is the one DOCKER_CLIENT chooses (buildtool.common.docker_cli): the setting
    it replaced, still set, stops the session with one line (exit 2), never silently ignored."""
    try:
        docker_cli.check_retired()
    except docker_cli.DockerError as exc:
        pytest.exit(str(exc), returncode=2)


def _docker(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """A timeout is a subprocess.TimeoutExpired that names the subcommand (docker_cli.DockerTimeout)."""
    return docker_cli.docker(*args, timeout=timeout)


def _read(path: Path, limit: int = 20000) -> str:
    try:
        with path.open("rb") as fh:
            size = path.stat().st_size
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


_STAGED: dict[str, Path] = {}


def scripts_for(framework: str | None) -> Path:
    """The folder mounted at /imagetests: the common scripts plus `framework`'s own (its folder's
    scripts/), copied once per session into one read-only folder. A framework script that would
    shadow a common one is refused (the framework table refuses it at load, too)."""
    key = framework or ""
    if key in _STAGED:
        return _STAGED[key]
    folder = Path(tempfile.mkdtemp(prefix="imagetests-scripts-"))
    atexit.register(shutil.rmtree, folder, True)
    sources = [SCRIPTS]
    if framework:
        own = TESTS_DIR / framework / "scripts"
        if not own.is_dir():
            raise RuntimeError(f"framework {framework!r} has no scripts folder {own}")
        sources.append(own)
    for source in sources:
        for path in sorted(source.glob("*.py")):
            target = folder / path.name
            if target.exists():
                raise RuntimeError(f"{path} shadows the common script {SCRIPTS / path.name}; rename it")
            shutil.copyfile(path, target)
            target.chmod(0o644)
    folder.chmod(0o755)
    _STAGED[key] = folder
    return folder


def _make_dir(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True)
    path.chmod(0o1777)  # whatever user the image runs as writes here
    return path


class Container:
    """One running container of the image under test."""

    def __init__(self, image: str, run_flags: list[str], *, run_id: str, out_root: Path, framework: str | None,
                 shared: Path | None = None, network: str = "host", name_hint: str = "main") -> None:
        self.image = image
        self.name = f"t-imagetest-{name_hint}-{uuid.uuid4().hex[:8]}"
        self.out_root = out_root
        if any(flag.startswith("--network") for flag in run_flags):
            network = ""  # a fault test's own network setting replaces the default
        args = ["run", "-d", "--init", "--name", self.name, "--label", f"{RUN_LABEL}={run_id}",
                *(["--network", network] if network else []), "-v", f"{scripts_for(framework)}:{SCRIPTS_IN}:ro",
                "-v", f"{out_root}:{OUT_IN}", "-e", "PYTHONUNBUFFERED=1", "-e", f"IMAGETEST_SLOWDOWN={SLOWDOWN}"]
        if shared is not None:
            args += ["-v", f"{shared}:{SHARED_IN}"]
        # The run profile's flags come last so a fault test's override (e.g. --shm-size=64m) wins.
        args += [*run_flags, image, "sleep", "infinity"]
        _LIVE.add(self.name)
        try:
            proc = _docker(*args, timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.remove()
            raise RuntimeError(f"starting a container of {image} did not finish within {START_TIMEOUT_S:.0f}s")\
                from None
        if proc.returncode != 0:
            self.remove()
            raise RuntimeError(f"cannot start {image} with {' '.join(run_flags)}: {last_line(proc.stderr)}")

    # -- state --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        proc = _docker("inspect", "--format", "{{json .State}}", self.name, timeout=60)
        if proc.returncode != 0:
            return {}
        try:
            return json.loads(proc.stdout)
        except ValueError:
            return {}

    def stopped_cause(self) -> str:
        """Why the container is not running, when it is not ('' while it runs)."""
        state = self.state()
        if not state:
            return f"the container {self.name} is gone"
        if state.get("Running"):
            return ""
        logs = _docker("logs", "--tail", "5", self.name, timeout=60)
        said = last_line(logs.stdout + "\n" + logs.stderr)
        oom = " (killed: out of memory)" if state.get("OOMKilled") else ""
        entry = image_entrypoint(self.image)
        return (f"the container stopped (exit code {state.get('ExitCode')}{oom}): the image's entrypoint "
                f"{entry} did not keep running the command it was given (`sleep infinity`), as "
                f"`docker run IMAGE CMD` must" + (f"; its last output: {said[:200]}" if said else ""))

    # -- probes -------------------------------------------------------------------------------

    def run(self, argv: list[str], *, step: str, quiet: float = QUIET_S,
            env: dict[str, str] | None = None) -> Probe:
        """Run `argv` under the supervisor as the image's user in its working directory.

        `step` names what it does ("<step> hung: no CPU or I/O for 30 s"); `quiet` is the longest
        it may show no progress (raise it where the probe waits on a peer or on a timeout of its
        own); it may run as long as the image's deadline allows while it makes progress."""
        probe = self.prepare(argv, step=step, quiet=quiet)
        return probe if probe.error else self.execute(probe, env)

    def prepare(self, argv: list[str], *, step: str, quiet: float = QUIET_S) -> Probe:
        """A probe not yet run: its folder made and its bound taken from the image's deadline (or the
        error that it is not run)."""
        if isinstance(argv, str):  # never a shell: its start-up files are the image's, not ours
            raise TypeError("probes take an argument list, never a shell string")
        probe = Probe(step=step, argv=list(argv), quiet=float(quiet))
        probe.bound = DEADLINE.bound()
        if probe.bound <= 1:
            probe.error = "not run: " + DEADLINE.describe()
            return probe
        ident = f"{re.sub(r'[^a-z0-9]+', '-', step.lower())[:40].strip('-')}-{uuid.uuid4().hex[:8]}"
        probe.dir = _make_dir(self.out_root, ident)
        return probe

    def execute(self, probe: Probe, env: dict[str, str] | None = None) -> Probe:
        """Run a prepared probe under the supervisor and read how it ended."""
        assert probe.dir is not None
        host_dir, ident, step = probe.dir, probe.dir.name, probe.step
        inside = f"{OUT_IN}/{ident}"
        # "{out}" in a value is the probe's own folder inside the container.
        envs = [x for k, v in (env or {}).items() for x in ("-e", f"{k}={v.replace('{out}', inside)}")]
        full = ["exec", *envs, self.name, "python3", "-I", "-S", f"{SCRIPTS_IN}/supervise.py", inside,
                _seconds(probe.bound), _seconds(probe.quiet), ident, "--", *probe.argv]
        started = time.monotonic()
        try:
            proc = _docker(*full, timeout=probe.bound + HOST_GRACE_S)
            engine_rc, engine_err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            self._kill_supervisor(host_dir)
            engine_rc, engine_err = None, ""
        probe.seconds = time.monotonic() - started
        if probe.read_record(host_dir):
            pass   # the supervisor said how it ended
        elif engine_rc is None:
            probe.lost = True  # even the supervisor did not come back
        elif stopped := self.stopped_cause():
            probe.error = stopped
        elif engine_rc in (126, 127) and not (host_dir / "supervisor.json").exists():
            probe.error = (f"cannot run python3 in the image as its default user (docker exec exit "
                           f"{engine_rc}: {last_line(engine_err)[:200]})")
        else:
            probe.error = f"the probe ended without a record (docker exec exit {engine_rc}: " \
                          f"{last_line(engine_err)[:200]})"
        if probe.timed_out or probe.lost:
            DEADLINE.spent_by = DEADLINE.spent_by or step
        return probe

    @contextlib.contextmanager
    def serving(self, script: str, *args: str, step: str, quiet: float = QUIET_S,
                ready: str = "serving.json") -> Iterator[dict[str, Any]]:
        """A probe script left running while the test inspects what it serves (a TensorBoard's socket,
        through `host`): yields the JSON object the script writes to `ready` in its folder once it serves;
        leaving the block writes `stop` there, which ends it. A script that ends, hangs or is cut before it
        is ready fails the test with its cause as the first line."""
        probe = self.prepare(["python3", f"{SCRIPTS_IN}/{script}", *args], step=step, quiet=quiet)
        if probe.error or probe.dir is None:
            pytest.fail(probe.cause(), pytrace=False)
        worker = threading.Thread(target=self.execute, args=(probe,), daemon=True)
        worker.start()
        try:
            while (found := _json(probe.dir / ready)) is None:
                if not worker.is_alive():
                    pytest.fail(probe.cause() or f"{step} ended without serving ({probe.tail(1)[:200]})",
                                pytrace=False)
                time.sleep(0.2)
            yield found
        finally:
            (probe.dir / "stop").touch()
            worker.join()

    def exec(self, argv: list[str], *, quiet: float = QUIET_S, env: dict[str, str] | None = None) -> Probe:
        """A command whose output its caller reads (a fixture framework's own group test); the
        shipped checks read result files instead."""
        return self.run(argv, step=f"`{' '.join(argv)[:60]}`", quiet=quiet, env=env)

    def python(self, script: str, *args: str, step: str, quiet: float = QUIET_S,
               env: dict[str, str] | None = None) -> Probe:
        """One of the scripts at /imagetests (common or the framework's) with the image's own Python (its
        site, as a user's script gets)."""
        return self.run(["python3", f"{SCRIPTS_IN}/{script}", *args], step=step, quiet=quiet, env=env)

    def result(self, script: str, *args: str, step: str, site: bool = True, quiet: float = QUIET_S) -> dict[str, Any]:
        """What a check needs of a probe: run the script, return the result.json it wrote. When it did not
        end well (hung, out of deadline, killed, exited non-zero, wrote no JSON object) the test fails with
        the cause as its first line (Probe.cause). `site=False` runs it with `python3 -I -S` (the standard
        library only, nothing the image's site adds)."""
        probe = self.python(script, *args, step=step, quiet=quiet) if site else \
            self.run(["python3", "-I", "-S", f"{SCRIPTS_IN}/{script}", *args], step=step, quiet=quiet)
        if not probe.ok or not isinstance(probe.result, dict):
            pytest.fail(probe.cause() or f"{step} wrote no JSON object but {type(probe.result).__name__}",
                        pytrace=False)
        return probe.result

    def _kill_supervisor(self, host_dir: Path) -> None:
        """The supervisor itself did not come back: kill it (and so its probe) from a second exec."""
        pid = (_json(host_dir / "supervisor.json") or {}).get("pid")
        if not pid:
            return
        code = f"import os, signal\ntry:\n    os.kill({int(pid)}, signal.SIGTERM)\nexcept OSError:\n    pass"
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _docker("exec", self.name, "python3", "-I", "-S", "-c", code, timeout=30)

    def remove(self) -> None:
        docker_cli.remove(self.name, timeout=120)
        _LIVE.discard(self.name)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


# What the first probe of a container imports besides the framework: TensorBoard and its
# plugins, which later probes start with their own bounds (tb_query.py waits 60 s).
WARM_UP_IMPORTS = ("tensorboard", "tensorboard_plugins")


def warm_up(container: Container, module: str) -> dict[str, Any]:
    """Import the framework (and TensorBoard) once in a new container, before any check: on a cold
    page cache this reads the image's libraries from disk, which may take most of a minute and
    is progress, not a hang. Returns what it cost (the verdict's cold_start). A hang or a spent
    deadline here fails every test that needs the container, naming it; an import that fails
    is left to the checks that need the module, which name it."""
    probe = container.python("warm_import.py", json.dumps([module, *WARM_UP_IMPORTS]),
                             step=f"import {module} for the first time in this image (cold start)")
    if probe.cut or (probe.error and probe.error.startswith("not run: ")):
        pytest.fail(probe.cause(), pytrace=False)
    imports = (probe.result or {}).get("imports") if isinstance(probe.result, dict) else None
    return {"image": container.image, "imports": imports or [], "seconds": round(probe.seconds, 2),
            "cpu_s": probe.cpu_s, "read_bytes": probe.read_bytes, "error": probe.cause() if not probe.ok else ""}


def image_entrypoint(image: str) -> str:
    """The image's ENTRYPOINT as JSON, or '(none)'."""
    proc = _docker("image", "inspect", "--format", "{{json .Config.Entrypoint}}", image, timeout=60)
    try:
        entry = json.loads(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        entry = None
    return json.dumps(entry) if entry else "(none)"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_once(image: str, run_flags: list[str], argv: list[str], *, run_id: str, out_root: Path,
             step: str, quiet: float = QUIET_S) -> tuple[Probe, Path]:
    """`docker run IMAGE ARGV...` through the image's entrypoint, as a user runs a command.

    Done as soon as the command has written its result.json (or the container has stopped). The
    command is the user's, so no supervisor starts it: a watcher exec'd beside it (supervise.py
    --watch) records when every process of the container has been quiet for `quiet` seconds
    (hung), and the image's deadline bounds the rest."""
    probe = Probe(step=step, argv=list(argv), quiet=float(quiet))
    probe.bound = DEADLINE.bound()
    if probe.bound <= 1:
        probe.error = "not run: " + DEADLINE.describe()
        return probe, out_root
    ident = f"once-{uuid.uuid4().hex[:8]}"
    host_dir = _make_dir(out_root, ident)
    watch_dir = _make_dir(host_dir, "watch")
    probe.dir = host_dir
    name = f"t-imagetest-once-{uuid.uuid4().hex[:8]}"
    args = ["run", "-d", "--init", "--name", name, "--label", f"{RUN_LABEL}={run_id}", "--network", "none",
            "-v", f"{scripts_for(None)}:{SCRIPTS_IN}:ro", "-v", f"{out_root}:{OUT_IN}",
            "-e", f"IMAGETEST_OUT={OUT_IN}/{ident}",
            *[f for f in run_flags if not f.startswith("--gpus")], image, *argv]
    _LIVE.add(name)
    started = time.monotonic()
    watcher: subprocess.Popen[bytes] | None = None
    try:
        proc = _docker(*args, timeout=START_TIMEOUT_S)
        if proc.returncode != 0:
            probe.error = f"cannot start {image}: {last_line(proc.stderr)}"
            return probe, host_dir
        watcher = subprocess.Popen(
            docker_cli.argv("exec", name, "python3", "-I", "-S", f"{SCRIPTS_IN}/supervise.py", "--watch",
                            f"{OUT_IN}/{ident}/watch", _seconds(probe.bound), _seconds(probe.quiet)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            probe.result = _json(host_dir / "result.json")
            state = _docker("inspect", "--format", "{{json .State}}", name, timeout=60)
            info = json.loads(state.stdout) if state.returncode == 0 and state.stdout.strip() else {}
            if probe.result is not None or not info.get("Running", False):
                probe.rc = info.get("ExitCode") if not info.get("Running", False) else 0
                # It may have written its result and exited between our read and the inspect.
                probe.result = probe.result if probe.result is not None else _json(host_dir / "result.json")
                break
            watched = _json(watch_dir / "exit.json") or {}
            if watched.get("stalled") or watched.get("timed_out"):
                probe.stalled, probe.timed_out = bool(watched.get("stalled")), bool(watched.get("timed_out"))
                break
            if time.monotonic() - started > probe.bound + HOST_GRACE_S:
                probe.lost = True
                break
            time.sleep(0.3)
        logs = _docker("logs", "--tail", "20", name, timeout=60)
        probe.out, probe.err = logs.stdout[-20000:], logs.stderr[-20000:]
    finally:
        docker_cli.remove(name, timeout=120)
        _LIVE.discard(name)
        if watcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                watcher.wait(timeout=30)
        probe.seconds = time.monotonic() - started
    return probe, host_dir


def remove_all() -> None:
    for name in list(_LIVE):
        with contextlib.suppress(OSError, docker_cli.DockerError):
            docker_cli.remove(name, timeout=120)
        _LIVE.discard(name)


def install_signal_cleanup() -> None:
    """SIGTERM behaves like Ctrl-C (pytest tears fixtures down); atexit catches the rest."""

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    atexit.register(remove_all)


def frontend_problems(served: dict[str, Any], plugin: str, pages: tuple[str, ...]) -> list[str]:
    """What a browser opening a TensorBoard plugin's tab would miss, from what tb_query.py fetched:
    its module, its index page, its own `pages` and TensorBoard's page, each answered 200 and non-empty."""
    fetched = served.get("frontend") or {}
    module = f"/data/plugin/{plugin}/"
    needed = [f"{module}index.js", f"{module}index.html", *[module + page for page in pages], "/"]
    broken = [f"{path} answered {fetched[path][0]} with {fetched[path][1]} bytes" for path in fetched
              if fetched[path][0] != 200 or not fetched[path][1]]
    return broken + [f"{path} was not fetched" for path in needed if path not in fetched]


def megabytes(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _seconds(value: float) -> str:
    """A bound or quiet window for supervise.py's command line."""
    return f"{value:.1f}"


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def skip(code: skips.SkipCode, text: str, subject: str = "") -> None:
    """Skip with a code the release gate can judge (buildtool.contracts.skips), never with bare prose."""
    pytest.skip(skips.skip_text(code, text, subject))
