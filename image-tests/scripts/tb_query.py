"""Start TensorBoard on a log folder inside the image and query it over HTTP from inside.

Runs in the image under test (mounted read-only; uses only the standard library and the
image's own TensorBoard). Writes result.json; TensorBoard's own log goes to the probe's
folder (never /tmp, which is the image's business). Modes: `listing` (plugins), `profiler`
(torch-tb-profiler run, views, worker overview), `profile` (the profile plugin of TensorBoard,
tensorboard-plugin-profile/xprof, which TensorFlow's and JAX's profilers write for: the run, its
tools, its hosts and the trace viewer's events), `scalars` (scalar tags and values), `empty`
(how fast an empty log folder answers). `--ui PLUGIN` also fetches the plugin's frontend as a
browser would: TensorBoard's own page, the plugin's module, its index.html, every local asset
that page names, and each `--ui-page`. `--expect-plugin NAME --plugin-dist DIST` says, when the
plugin is not loaded, why: not installed, no entry point, or an entry point that fails to load.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import html.parser
import importlib.metadata as md
import json
import os
import posixpath
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from probe_io import error_line, out_dir, result

PROFILER = "/data/plugin/pytorch_profiler"
PROFILE = "/data/plugin/profile"
TRACE_TOOL = "trace_viewer@"   # the profile plugin's trace viewer (XPlane converted to trace events)
MAX_NAMES = 2000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(base: str, path: str, timeout: float = 10) -> tuple[int, bytes, str]:
    """(status, body, content type); a gzip body (TensorBoard compresses some) comes back unpacked."""
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            status, body, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, body, headers = exc.code, exc.read(), exc.headers
    if headers is not None and headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return status, body, headers.get("Content-Type", "") if headers is not None else ""


def get(base: str, path: str, timeout: float = 10) -> tuple[int, object]:
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
            last = (0, str(exc))
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
            status, body, kind = fetch(base, path, timeout=30)
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


def diagnose_plugin(dists: list) -> str:
    """Why a plugin that should be there is not loaded (the test's message)."""
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
    ap.add_argument("--mode", choices=("listing", "profiler", "profile", "scalars", "empty"), required=True)
    ap.add_argument("--timeout", type=float, default=60, help="bound for start and for data to appear")
    ap.add_argument("--run", default="")
    ap.add_argument("--tag", default="")
    ap.add_argument("--ui", default="", help="fetch this plugin's frontend")
    ap.add_argument("--ui-page", action="append", default=[])
    ap.add_argument("--mkdir", action="store_true", help="create the log folder first (an empty one)")
    ap.add_argument("--expect-plugin", default="")
    ap.add_argument("--plugin-dist", action="append", default=[])
    args = ap.parse_args()

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
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([exe, "--logdir", args.logdir, "--host", "127.0.0.1", "--port", str(port),
                                 "--reload_interval", "1"], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    out["port"] = port
    base = f"http://127.0.0.1:{port}"
    deadline = started + args.timeout
    try:
        status, listing = wait_for(base, "/data/plugins_listing", deadline, gone=lambda: proc.poll() is not None)
        out["startup_s"] = round(time.monotonic() - started, 2)
        if status != 200:
            code = proc.poll()
            with open(log_path, errors="replace") as fh:
                text = fh.read()
            out["log_tail"] = text[-3000:]
            out["exit_code"] = code
            out["error"] = (f"TensorBoard exited with code {code} at start: {crash_line(text)}" if code is not None
                            else f"TensorBoard did not answer within {args.timeout:.0f}s of starting ({listing})")
            return emit(out)
        out["started"] = True
        out["plugins"] = {name: bool(info.get("enabled")) for name, info in listing.items()} \
            if isinstance(listing, dict) else {}
        if args.expect_plugin and args.expect_plugin not in out["plugins"]:
            out["plugin_missing"] = diagnose_plugin(args.plugin_dist or [args.expect_plugin])
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
        elif args.mode == "profile":
            out.update(profile_run(base, args.run, deadline))
        elif args.mode == "scalars":
            status, tags = wait_for(base, "/data/plugin/scalars/tags", deadline,
                                    lambda s, b: s == 200 and isinstance(b, dict) and args.tag in b.get(args.run, {}))
            out["tags"] = {"status": status, "body": tags}
            q = urllib.parse.urlencode({"run": args.run, "tag": args.tag})
            out["scalars"] = get(base, "/data/plugin/scalars/scalars?" + q)
        return emit(out)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


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
