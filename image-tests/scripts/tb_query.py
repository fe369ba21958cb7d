"""Start TensorBoard on a log folder inside the image and query it over HTTP from inside.

Runs in the image under test (mounted read-only; uses only the standard library and the
image's own TensorBoard). Writes result.json; TensorBoard's own log goes to the probe's
folder (never /tmp, which is the image's business). Modes: `listing` (plugins), `profiler`
(torch-tb-profiler run, views, worker overview), `profile` (the profile plugin of TensorBoard,
tensorboard-plugin-profile/xprof, which TensorFlow's and JAX's profilers write for: the run, its
tools, its hosts and the trace viewer's events), `scalars` (scalar tags and values), `empty`
(how fast an empty log folder answers), `serve` (TensorBoard started as a user starts it, without --host,
left serving until the test writes `stop` into the probe's folder: serving.json says its port once it answers,
and the test inspects its socket through testinfra's `host`). `--ui PLUGIN` also fetches the plugin's frontend as a
browser would: TensorBoard's own page, the plugin's module, its index.html, every local asset
that page names, and each `--ui-page`. `--expect-plugin NAME --plugin-dist DIST` says, when the
plugin is not loaded, why: not installed, no entry point, or an entry point that fails to load.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import html.parser
import importlib
import importlib.metadata as md
import json
import os
import posixpath
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from probe_io import error_line, out_dir, result, write

PROFILER = "/data/plugin/pytorch_profiler"
PROFILE = "/data/plugin/profile"
TRACE_TOOL = "trace_viewer@"   # the profile plugin's trace viewer (XPlane converted to trace events)
MAX_NAMES = 2000


def slowdown() -> int:
    """How many times slower than native this image runs (harness.SLOWDOWN: QEMU), 1 when unset; every bound below
    stretches by it, so a value that is no factor (text, 0, negative, beyond the matrix's bound of 20 many times
    over) is refused by name, never a traceback or a wait of no time."""
    value = os.environ.get("IMAGETEST_SLOWDOWN")
    if value is None:
        return 1
    if not re.fullmatch(r"[0-9]{1,3}", value) or not 1 <= int(value) <= 100:
        print(f"{os.path.basename(__file__)}: IMAGETEST_SLOWDOWN={value!r} is not a whole number from 1 to 100 (how "
              "many times slower than native the image runs; the harness sets it from the target's slowdown)",
              file=sys.stderr)
        sys.exit(2)
    return int(value)


SLOWDOWN = slowdown()
SERVE_S = 60 * SLOWDOWN  # `serve`: the longest TensorBoard is left serving for the test's inspection


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PROXY_NAMES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY")
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def proxy_for(url: str) -> str:
    """`NAME=value` of the proxy urllib sends `url` through with this environment ('' when none)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    proxies = urllib.request.getproxies()
    if "http" not in proxies or urllib.request.proxy_bypass(host):
        return ""
    name = next((n for n in PROXY_NAMES[:4] if os.environ.get(n) == proxies["http"]), "http_proxy")
    return f"{name}={shown(proxies['http'])}"


def redirecting() -> str:
    """The variables that could send a local connection of urllib elsewhere, as set, for a message."""
    found = [f"{n}={shown(os.environ[n])}" for n in PROXY_NAMES if n in os.environ]
    return ("the environment could redirect it: " + ", ".join(found)) if found else \
        "no variable that could redirect it is set (http_proxy, all_proxy, no_proxy, upper case too)"


def shown(value: str) -> str:
    return re.sub(r"(://[^:/@\s]*:)[^@/\s]*@", r"\1***@", value)


def answers_directly(url: str) -> bool:
    """Whether `url` answers without any proxy (TensorBoard serving, only the proxy in the way)."""
    try:
        with DIRECT.open(url, timeout=5 * SLOWDOWN) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, urllib.error.URLError):
        return False


class ProxiedAway(Exception):
    """A local URL went to a proxy and failed there, while it answers without the proxy."""


def fetch(base: str, path: str, timeout: float = 10 * SLOWDOWN) -> tuple[int, bytes, str]:
    """(status, body, content type); a gzip body (TensorBoard compresses some) comes back unpacked.
    Through the environment's proxies, as the image's own clients go; a local URL that fails through a
    proxy but answers without it raises ProxiedAway naming the proxy."""
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            status, body, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, body, headers = exc.code, exc.read(), exc.headers
        via = proxy_for(base)
        if via and status >= 500 and answers_directly(base + path):
            raise ProxiedAway(f"{base}{path} went to the proxy {via} (no_proxy does not cover "
                              f"{urllib.parse.urlsplit(base).hostname}), which answered {status}; it answers without "
                              "the proxy") from None
    except (OSError, urllib.error.URLError) as exc:
        via = proxy_for(base)
        if via and answers_directly(base + path):
            raise ProxiedAway(f"{base}{path} went to the proxy {via} (no_proxy does not cover "
                              f"{urllib.parse.urlsplit(base).hostname}) and failed ({error_line(exc)}); it answers "
                              "without the proxy") from None
        raise
    if headers is not None and headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return status, body, headers.get("Content-Type", "") if headers is not None else ""


def get(base: str, path: str, timeout: float = 10 * SLOWDOWN) -> tuple[int, object]:
    status, raw, _ = fetch(base, path, timeout)
    body = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body[:300]


def wait_for(base: str, path: str, deadline: float, ready=lambda status, body: status == 200,
             gone=lambda: False) -> tuple[int, object]:
    """Poll until `ready`, the deadline, or `gone()` (TensorBoard exited: no point waiting)."""
    last: tuple[int, object] = (0, "no answer")
    while time.monotonic() < deadline:
        try:
            last = get(base, path)
            if ready(*last):
                return last
        except (OSError, urllib.error.URLError) as exc:
            last = (0, f"{base}{path}: {exc}")
        if gone():
            return last
        time.sleep(0.3)
    return last


class _Assets(html.parser.HTMLParser):
    """Local files a page loads (script src, link href, img src), not remote ones."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        names = {"script": "src", "link": "href", "img": "src"}
        want = names.get(tag)
        for key, value in attrs:
            if key == want and value and not value.startswith(("http:", "https:", "//", "data:", "#", "/")):
                self.found.append(value.split("?")[0].split("#")[0])


def frontend(base: str, listing: dict, plugin: str, pages: list) -> dict:
    """Fetch what a browser fetches to show `plugin`'s tab; {path: [status, bytes, content type]}."""
    out: dict = {}

    def take(path: str) -> tuple[int, bytes]:
        try:
            status, body, kind = fetch(base, path, timeout=30 * SLOWDOWN)
        except (OSError, urllib.error.URLError) as exc:
            out[path] = [0, 0, error_line(exc)]
            return 0, b""
        out[path] = [status, len(body), kind]
        return status, body

    take("/")  # TensorBoard's own page
    mechanism = (listing.get(plugin) or {}).get("loading_mechanism") or {}
    module = mechanism.get("module_path") or ""
    if not module:
        out["(loading_mechanism)"] = [0, 0, json.dumps(mechanism)]
        return out
    take(module)
    folder = posixpath.dirname(module)
    status, body = take(folder + "/index.html")
    if status == 200 and body:
        parser = _Assets()
        parser.feed(body.decode("utf-8", "replace"))
        for asset in dict.fromkeys(parser.found):
            take(posixpath.normpath(folder + "/" + asset))
    for page in pages:
        take(folder + "/" + page)
    return out


def missing_files(dist) -> list:
    """Files the distribution's RECORD lists that are gone (a native module, a static file); bytecode,
    which an image may drop and Python rewrites, is left out."""
    gone = []
    for path in dist.files or []:
        if path.suffix == ".pyc" or "__pycache__" in path.parts or path.parts[0].endswith(".dist-info"):
            continue
        with contextlib.suppress(OSError, ValueError):
            if not os.path.exists(str(path.locate())):
                gone.append(str(path))
    return gone


def import_failure(dist, skip: tuple = ("test", "tests", "integration_tests")) -> str:
    """The first module of the distribution that fails to import, with its error ('' when all import); a
    module whose file is gone is left out (missing_files names it): what imports it is the answer."""
    names = []
    for path in dist.files or []:
        parts = list(path.parts)
        if path.suffix not in (".py", ".so") or parts[0].endswith((".dist-info", ".data")) or \
                any(p in skip or p.startswith("test_") for p in parts) or "__pycache__" in parts or \
                not os.path.exists(str(path.locate())):
            continue
        parts[-1] = parts[-1].split(".")[0]
        if parts[-1] == "__init__":
            parts.pop()
        if parts and all(p.isidentifier() for p in parts):
            names.append(".".join(parts))
    for name in sorted(set(names), key=lambda n: (n.count("."), n)):
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - this is the answer
            return f"importing {name} fails: {error_line(exc)}"
    return ""


def log_lines(log_text: str, words: tuple) -> list:
    """TensorBoard's log lines that say why a plugin did not load."""
    wanted = ("unable to load", "import error", "error", "failed", "cannot")
    return [line.strip()[:300] for line in log_text.splitlines()
            if any(w.lower() in line.lower() for w in words) and any(w in line.lower() for w in wanted)][:3]


def diagnose_plugin(dists: list, log_text: str = "") -> str:
    """Why a plugin that should be there is not loaded (the test's message): not installed, no entry
    point, an entry point that fails to load, or a plugin whose files are gone or whose modules fail to
    import (a missing native module), with what TensorBoard's own log says about it."""
    installed = {}
    for name in dists:
        with contextlib.suppress(md.PackageNotFoundError):
            installed[name] = md.distribution(name)
    if not installed:
        return "{} is not installed".format(" or ".join(dists))
    what = ", ".join(f"{name} {dist.version}" for name, dist in installed.items())
    ours = [ep for dist in installed.values() for ep in dist.entry_points if ep.group == "tensorboard_plugins"]
    if not ours:
        return (f"{what} is installed but declares no `tensorboard_plugins` entry point, so TensorBoard never "
                "loads it (its entry_points.txt lost the entry)")
    for ep in ours:
        try:
            ep.load()
        except BaseException as exc:  # noqa: BLE001 - this is the answer
            return f"{what} is installed but its entry point {ep.name} = {ep.value} fails to load: {error_line(exc)}"
    listed = ", ".join(f"{ep.name} = {ep.value}" for ep in ours)
    gone = [f"{path} (in the RECORD of {name})" for name, dist in installed.items() for path in missing_files(dist)]
    failing = next((f for f in (import_failure(dist) for dist in installed.values()) if f), "")
    said = log_lines(log_text, tuple({ep.name for ep in ours} | {ep.value.split(".")[0] for ep in ours} | {"plugin"}))
    causes = ([f"files of it are missing: {', '.join(gone[:5])}"] if gone else []) + \
        ([failing] if failing else []) + ([f"TensorBoard's log: {' | '.join(said)}"] if said else [])
    if causes:
        return f"{what} is installed and its entry point {listed} loads, but the plugin does not: " + "; ".join(causes)
    return f"{what} is installed and its entry point {listed} loads, but TensorBoard did not list the plugin"


def crash_line(log_text: str) -> str:
    """For people: the line of TensorBoard's log that names its exception, else its last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Exit")) and " " not in head:
            return line
    return lines[-1] if lines else "no output"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--mode", choices=("listing", "profiler", "profile", "scalars", "empty", "serve"), required=True)
    ap.add_argument("--timeout", type=float, default=60, help="bound for start and for data to appear")
    ap.add_argument("--run", default="")
    ap.add_argument("--tag", default="")
    ap.add_argument("--ui", default="", help="fetch this plugin's frontend")
    ap.add_argument("--ui-page", action="append", default=[])
    ap.add_argument("--mkdir", action="store_true", help="create the log folder first (an empty one)")
    ap.add_argument("--expect-plugin", default="")
    ap.add_argument("--plugin-dist", action="append", default=[])
    ap.add_argument("--profile-run", default="", help="scalars mode: also the profile plugin's trace of this run")
    args = ap.parse_args()
    args.timeout *= SLOWDOWN

    out: dict = {"started": False}
    if args.mkdir:
        try:
            os.makedirs(args.logdir, exist_ok=True)
        except OSError as exc:
            out["error"] = f"cannot create the log folder: {error_line(exc)}"
            return emit(out)
    exe = shutil.which("tensorboard")
    if exe is None:
        out["error"] = "no `tensorboard` command on PATH (PATH={})".format(os.environ.get("PATH", ""))
        result(out)
        return 0
    port = free_port()
    log_path = os.path.join(out_dir(), "tensorboard.log")
    started = time.monotonic()
    # `serve`: TensorBoard's own default address, what `tensorboard --logdir DIR` gives a user.
    where = [] if args.mode == "serve" else ["--host", "127.0.0.1"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([exe, "--logdir", args.logdir, *where, "--port", str(port), "--reload_interval", "1"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out["port"] = port
    base = f"http://{'localhost' if args.mode == 'serve' else '127.0.0.1'}:{port}"
    deadline = started + args.timeout
    try:
        return query(args, out, proc, base, started, deadline, log_path)
    except ProxiedAway as exc:
        out["error"] = f"a local connection went to a proxy: {exc}"
        out["proxied"] = True
        return emit(out)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def query(args: argparse.Namespace, out: dict, proc: subprocess.Popen, base: str, started: float, deadline: float,
          log_path: str) -> int:
    """What the mode asks of the TensorBoard at `base`, into `out`."""
    status, listing = wait_for(base, "/data/plugins_listing", deadline, gone=lambda: proc.poll() is not None)
    out["startup_s"] = round(time.monotonic() - started, 2)
    if status != 200:
        code = proc.poll()
        with open(log_path, errors="replace") as fh:
            text = fh.read()
        out["log_tail"] = text[-3000:]
        out["exit_code"] = code
        out["error"] = (f"TensorBoard exited with code {code} at start: {crash_line(text)}" if code is not None
                        else f"TensorBoard did not answer within {args.timeout:.0f}s of starting: the local "
                             f"connection to {base}/data/plugins_listing failed ({listing}); {redirecting()}")
        return emit(out)
    out["started"] = True
    out["plugins"] = {name: bool(info.get("enabled")) for name, info in listing.items()} \
        if isinstance(listing, dict) else {}
    if args.mode == "serve":
        write("serving.json", {"port": int(urllib.parse.urlsplit(base).port or 0), "pid": proc.pid})
        stop = os.path.join(out_dir(), "stop")
        while not os.path.exists(stop) and proc.poll() is None and time.monotonic() < deadline + SERVE_S:
            time.sleep(0.2)
        out["exit_code"] = proc.poll()
        return emit(out)
    if args.expect_plugin and args.expect_plugin not in out["plugins"]:
        with open(log_path, errors="replace") as fh:
            out["plugin_missing"] = diagnose_plugin(args.plugin_dist or [args.expect_plugin], fh.read())
    if args.ui and args.ui in out["plugins"]:
        out["frontend"] = frontend(base, listing, args.ui, args.ui_page)
    if args.mode in ("empty", "profiler") and "pytorch_profiler" not in out["plugins"]:
        return emit(out)  # no plugin: nothing to wait for
    if args.mode == "profile" and "profile" not in out["plugins"]:
        return emit(out)
    if args.mode == "empty":
        status, body = get(base, PROFILER + "/runs", timeout=args.timeout)
        out["profiler_runs"] = {"status": status, "body": body}
        out["answered_s"] = round(time.monotonic() - started, 2)
    elif args.mode == "profiler":
        status, runs = wait_for(base, PROFILER + "/runs", deadline,
                                lambda s, b: s == 200 and isinstance(b, dict) and args.run in b.get("runs", []))
        out["runs"] = {"status": status, "body": runs}
        if status == 200 and isinstance(runs, dict) and args.run in runs.get("runs", []):
            q = urllib.parse.urlencode
            out["views"] = get(base, "{}/views?{}".format(PROFILER, q({"run": args.run})))
            code, workers = get(base, "{}/workers?{}".format(PROFILER, q({"run": args.run, "view": "Overview"})))
            out["workers"] = [code, workers]
            if code == 200 and workers:
                worker = workers[0]
                code, spans = get(base, "{}/spans?{}".format(PROFILER, q({"run": args.run, "worker": worker})))
                span = spans[0] if code == 200 and spans else ""
                code, overview = get(base, "{}/overview?{}".format(
                    PROFILER, q({"run": args.run, "worker": worker, "span": span})))
                out["overview"] = [code, sorted(overview) if isinstance(overview, dict) else overview]
                if isinstance(overview, dict):
                    out["environments"] = overview.get("environments")
                    out["overview_steps"] = step_rows(overview)
                out.update(profiler_views(base, {"run": args.run, "worker": worker, "span": span},
                                          "Kernel" in (out["views"][1] or [])))
    elif args.mode == "profile":
        out.update(profile_run(base, args.run, deadline))
    elif args.mode == "scalars":
        status, tags = wait_for(base, "/data/plugin/scalars/tags", deadline,
                                lambda s, b: s == 200 and isinstance(b, dict) and args.tag in b.get(args.run, {}))
        out["tags"] = {"status": status, "body": tags}
        q = urllib.parse.urlencode({"run": args.run, "tag": args.tag})
        out["scalars"] = get(base, "/data/plugin/scalars/scalars?" + q)
        if args.profile_run and "profile" in out["plugins"]:
            out["profile"] = profile_run(base, args.profile_run, deadline)
    return emit(out)


def step_rows(overview: dict) -> list:
    """The Overview's step-time table as [[step, total microseconds], ...]: what its chart draws."""
    table = overview.get("steps") or {}
    columns = table.get("columns") or []
    numbers = [i for i, c in enumerate(columns) if isinstance(c, dict) and c.get("type") == "number"]
    rows = []
    for row in table.get("rows") or []:
        if isinstance(row, list) and row:
            rows.append([str(row[0]), sum(float(row[i]) for i in numbers if i < len(row)
                                          and isinstance(row[i], (int, float)))])
    return rows


def profiler_views(base: str, where: dict, kernels: bool) -> dict:
    """What the Operator (and, with GPU activity, Kernel) view lists and what the Trace view draws:
    {"operators": [status, [[name, calls], ...]], "kernels": [status, [[name, calls], ...]],
    "trace": {"status", "events", "categories", "steps": {step: operator events inside it}, "kernels",
    "operator_names"}}."""
    q = urllib.parse.urlencode
    out: dict = {}
    code, table = get(base, "{}/operation/table?{}".format(PROFILER, q({**where, "group_by": "Operation"})))
    rows = table.get("data") if isinstance(table, dict) else None
    out["operators"] = [code, [[r.get("name"), r.get("calls")] for r in rows or [] if isinstance(r, dict)][:MAX_NAMES]]
    if kernels:
        code, table = get(base, "{}/kernel/table?{}".format(PROFILER, q({**where, "group_by": "Kernel"})))
        data = table.get("data") if isinstance(table, dict) else None
        names = (data or {}).get("rows") if isinstance(data, dict) else data
        out["kernels"] = [code, [r[:2] if isinstance(r, list) else [r.get("name"), r.get("calls")]
                                 for r in names or [] if isinstance(r, (list, dict))][:MAX_NAMES]]
    try:
        status, raw, _ = fetch(base, f"{PROFILER}/trace?{q(where)}", timeout=60 * SLOWDOWN)
    except (OSError, urllib.error.URLError) as exc:
        status, raw = 0, f"{base}{PROFILER}/trace failed: {error_line(exc)}".encode()
    out["trace"] = trace_summary(status, raw)
    return out


def trace_summary(status: int, raw: bytes) -> dict:
    """A PyTorch profiler trace, as the Trace view gets it: its events by category, the operator events
    (`cpu_op`) inside each traced step (`ProfilerStep#N`), and its GPU kernel events."""
    found: dict = {"status": status, "events": 0, "categories": {}, "steps": {}, "kernels": 0, "operator_names": []}
    try:
        events = json.loads(raw.decode("utf-8", "replace")).get("traceEvents") or []
    except (ValueError, AttributeError) as exc:
        found["error"] = f"the Trace view's data is not trace JSON: {error_line(exc)}; {raw[:200]!r}"
        return found
    events = [e for e in events if isinstance(e, dict)]
    found["events"] = len(events)
    for event in events:
        key = str(event.get("cat") or f"(ph {event.get('ph')})")
        found["categories"][key] = found["categories"].get(key, 0) + 1
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    for step in (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"):
        start, end = float(step.get("ts", 0)), float(step.get("ts", 0)) + float(step.get("dur", 0))
        found["steps"][step["name"]] = sum(1 for op in ops if start <= float(op.get("ts", -1)) <= end)
    found["kernels"] = sum(1 for e in events if e.get("cat") == "kernel")
    found["operator_names"] = sorted({str(op.get("name", ""))[:200] for op in ops})[:MAX_NAMES]
    return found


def profile_run(base: str, run: str, deadline: float) -> dict:
    """What the profile plugin serves for `run`: {"runs": [status, body], "tools", "hosts", "trace":
    {"status", "events", "names"}} (the trace viewer's events of the run's first host, their names
    de-duplicated). Stops at the first answer that is not there, recording it."""
    out: dict = {}
    status, runs = wait_for(base, PROFILE + "/runs", deadline,
                            lambda s, b: s == 200 and isinstance(b, list) and run in b)
    out["runs"] = [status, runs]
    if not (status == 200 and isinstance(runs, list) and run in runs):
        return out
    q = urllib.parse.urlencode
    out["tools"] = list(get(base, "{}/run_tools?{}".format(PROFILE, q({"run": run}))))
    status, hosts = get(base, "{}/hosts?{}".format(PROFILE, q({"run": run, "tag": TRACE_TOOL})))
    out["hosts"] = [status, hosts]
    names = [h.get("hostname") if isinstance(h, dict) else h for h in hosts] if status == 200 and \
        isinstance(hosts, list) else []
    if not names:
        return out
    status, raw, _ = fetch(base, "{}/data?{}".format(PROFILE, q({"run": run, "tag": TRACE_TOOL, "host": names[0]})),
                           timeout=max(10.0, deadline - time.monotonic()))
    trace: dict = {"status": status, "host": names[0], "events": 0, "names": []}
    try:
        events = json.loads(raw.decode("utf-8", "replace")).get("traceEvents") or []
        trace["events"] = len(events)
        trace["names"] = sorted({str(e.get("name", ""))[:200] for e in events if isinstance(e, dict)})[:MAX_NAMES]
    except (ValueError, AttributeError) as exc:
        trace["error"] = f"the trace viewer's data is not trace JSON: {error_line(exc)}; {raw[:200]!r}"
    out["trace"] = trace
    return out


def emit(out: dict) -> int:
    result(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
