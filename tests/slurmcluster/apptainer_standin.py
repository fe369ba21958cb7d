"""A stand-in for `apptainer exec|run` (apptainer is not installable here): runc on an OCI bundle of the image.

    apptainer_standin.py ROOT exec|run [--nv] [--bind SRC:DST[:ro]]... docker://IMAGE CMD...

`run` runs the image's runscript (its ENTRYPOINT, then the arguments): the images the tests use (the project's
pip images) have no ENTRYPOINT, so here it runs CMD as `exec` does.

LocalSlurm puts a two-line `apptainer` wrapper calling this first on PATH. It runs CMD the way apptainer
would on a node: the host's environment with the image's PATH, the current folder bound and kept as the
working folder, the host's /dev/shm (apptainer shares it: that is why the generated script checks the
node's /dev/shm), a read-only image, the given binds, only a mount namespace (plus a uts namespace whose
hostname is the SLURM node name: one host plays several nodes here). IMAGE is looked up in
ROOT/apptainer/bundles.json ({reference: bundle folder}); an unknown image fails as apptainer's pull would.
TERM/INT/HUP are passed to the container; the container is always deleted.
"""

import json
import os
import signal
import subprocess
import sys
import uuid


def fail(message: str) -> None:
    print(f"FATAL:   {message}", file=sys.stderr)
    sys.exit(255)


def main() -> int:
    root, args = sys.argv[1], sys.argv[2:]
    if not args or args[0] not in ("exec", "run"):
        fail(f"the stand-in implements `apptainer exec` and `run` only, not {args[:1]}")
    args, binds = args[1:], []
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option in ("--bind", "-B") and args:
            binds += args.pop(0).split(",")
        elif option != "--nv":  # no GPU here; the flag is accepted as apptainer does
            fail(f"option {option} is not implemented by the stand-in")
    if len(args) < 2:
        fail("usage: apptainer exec [options] IMAGE COMMAND...")
    image, command = args[0], args[1:]
    with open(os.path.join(root, "apptainer", "bundles.json")) as handle:
        bundles = json.load(handle)
    bundle = bundles.get(image.removeprefix("docker://"))
    if bundle is None:
        fail(f"Unable to handle {image} uri: no bundle for it (stand-in knows {', '.join(bundles) or 'none'})")
    with open(os.path.join(bundle, "config.json")) as handle:
        config = json.load(handle)
    image_env = dict(e.split("=", 1) for e in config["process"].get("env", []))
    env = {**os.environ, "PATH": image_env.get("PATH", os.environ.get("PATH", ""))}
    cwd = os.getcwd()
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    config["process"].update(args=command, env=[f"{k}={v}" for k, v in env.items()], cwd=cwd, terminal=False)
    config["root"] = {"path": os.path.join(bundle, "rootfs"), "readonly": True}
    config["hostname"] = node
    config["linux"]["namespaces"] = [{"type": "mount"}, {"type": "uts"}]
    mounts = [m for m in config["mounts"] if m["destination"] != "/dev/shm"]
    mounts.append({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "rw"]})
    mounts.append({"destination": cwd, "type": "bind", "source": cwd, "options": ["rbind", "rw"]})
    for bind in binds:
        parts = bind.split(":")
        source, target = parts[0], parts[1] if len(parts) > 1 else parts[0]
        mode = "ro" if parts[2:] == ["ro"] else "rw"
        mounts.append({"destination": target, "type": "bind", "source": os.path.abspath(source),
                       "options": ["rbind", mode]})
    config["mounts"] = mounts
    cid = f"apptainer-{node}-{uuid.uuid4().hex[:10]}"
    spool = os.path.join(root, "apptainer", "spool", cid)
    os.makedirs(spool)
    with open(os.path.join(spool, "config.json"), "w") as handle:
        json.dump(config, handle)
    runc = ["runc", f"--root={root}/runc"]
    proc = subprocess.Popen([*runc, "run", cid, "-b", spool])

    def forward(signum: int, _frame: object) -> None:
        subprocess.run([*runc, "kill", "-a", cid, str(signum)], capture_output=True, timeout=30)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        return proc.wait()
    finally:
        subprocess.run([*runc, "delete", "--force", cid], capture_output=True, timeout=30)
        os.unlink(os.path.join(spool, "config.json"))
        os.rmdir(spool)


if __name__ == "__main__":
    sys.exit(main())
