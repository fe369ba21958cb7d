"""Start TensorBoard on a log folder inside the image and query it over HTTP from inside.

Runs in the image under test (mounted read-only; uses only the standard library and the
image's own TensorBoard). Prints one line `TB_RESULT <json>`; the test asserts on it.
Modes: `listing` (plugins), `profiler` (torch-tb-profiler run, views, worker overview),
`scalars` (scalar tags and values), `empty` (how fast an empty log folder answers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

PROFILER = "/data/plugin/pytorch_profiler"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(base: str, path: str, timeout: float = 10) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            body = resp.read().decode("utf-8", "replace")
            try:
                return resp.status, json.loads(body)
            except ValueError:
                return resp.status, body[:200]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[:300]


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--mode", choices=("listing", "profiler", "scalars", "empty"), required=True)
    ap.add_argument("--timeout", type=float, default=90, help="bound for start and for data to appear")
    ap.add_argument("--run", default="")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    port = free_port()
    exe = shutil.which("tensorboard") or "tensorboard"
    log_path = f"/tmp/tensorboard-{port}.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    started = time.monotonic()
    proc = subprocess.Popen([exe, "--logdir", args.logdir, "--host", "127.0.0.1", "--port", str(port),
                             "--reload_interval", "1"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    result: dict[str, object] = {"port": port}
    base = f"http://127.0.0.1:{port}"
    deadline = started + args.timeout
    try:
        status, listing = wait_for(base, "/data/plugins_listing", deadline, gone=lambda: proc.poll() is not None)
        result["startup_s"] = round(time.monotonic() - started, 2)
        if status != 200:
            result["started"] = False
            result["exit_code"] = proc.poll()
            log.flush()
            with open(log_path, errors="replace") as fh:
                result["log_tail"] = fh.read()[-3000:]
            return emit(result)
        result["started"] = True
        result["plugins"] = {name: bool(info.get("enabled")) for name, info in listing.items()} \
            if isinstance(listing, dict) else {}
        if args.mode in ("empty", "profiler") and "pytorch_profiler" not in result["plugins"]:
            return emit(result)  # no plugin: nothing to wait for
        if args.mode == "empty":
            status, body = get(base, f"{PROFILER}/runs", timeout=args.timeout)
            result["profiler_runs"] = {"status": status, "body": body}
            result["answered_s"] = round(time.monotonic() - started, 2)
        elif args.mode == "profiler":
            status, runs = wait_for(base, f"{PROFILER}/runs", deadline,
                                    lambda s, b: s == 200 and isinstance(b, dict) and args.run in b.get("runs", []))
            result["runs"] = {"status": status, "body": runs}
            if status == 200 and isinstance(runs, dict) and args.run in runs.get("runs", []):
                q = urllib.parse.urlencode
                result["views"] = get(base, f"{PROFILER}/views?{q({'run': args.run})}")
                view = "Overview"
                code, workers = get(base, f"{PROFILER}/workers?{q({'run': args.run, 'view': view})}")
                result["workers"] = [code, workers]
                if code == 200 and workers:
                    worker = workers[0]
                    code, spans = get(base, f"{PROFILER}/spans?{q({'run': args.run, 'worker': worker})}")
                    span = spans[0] if code == 200 and spans else ""
                    code, overview = get(base, f"{PROFILER}/overview?"
                                         f"{q({'run': args.run, 'worker': worker, 'span': span})}")
                    result["overview"] = [code, sorted(overview) if isinstance(overview, dict) else overview]
                    if isinstance(overview, dict):
                        result["environments"] = overview.get("environments")
        elif args.mode == "scalars":
            status, tags = wait_for(base, "/data/plugin/scalars/tags", deadline,
                                    lambda s, b: s == 200 and isinstance(b, dict) and args.tag in b.get(args.run, {}))
            result["tags"] = {"status": status, "body": tags}
            q = urllib.parse.urlencode({"run": args.run, "tag": args.tag})
            result["scalars"] = get(base, f"/data/plugin/scalars/scalars?{q}")
        return emit(result)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def emit(result: dict[str, object]) -> int:
    print("TB_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
