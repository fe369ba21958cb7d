"""RunTimeRun of the one-host test cluster (oci.conf): `oci_run.py ROOT NODE CONTAINER_ID BUNDLE`.

slurmstepd has already written the task's config into BUNDLE/config.json (a per-task copy in the slurmd
spool folder, safe to edit). Before exec'ing runc this gives the container what a separate machine would
have: its own hostname (= the node name, in a uts namespace of its own), so torch's c10d backend sees
distinct hosts and only the endpoint's node hosts the store. Then it applies the test faults set for
this job name on this node: ROOT/faults/<job name>.<node>.delay (seconds to wait before starting the
step that runs torchrun: a node that joins late), ROOT/faults/<job name>.<node>.shm (a smaller
/dev/shm on that node) and ROOT/faults/<job name>.<node>.hosts (the container's /etc/hosts, in place of the
bundle's: without the node names, as on a cluster whose node names are not in DNS). Keyed by job name, so
jobs running side by side do not see each other's faults.
"""

import json
import os
import sys
import time

root, node, cid, bundle = sys.argv[1:5]
faults = os.path.join(root, "faults")
path = os.path.join(bundle, "config.json")
with open(path) as handle:
    config = json.load(handle)
config["hostname"] = node
namespaces = config.setdefault("linux", {}).setdefault("namespaces", [])
if not any(ns["type"] == "uts" for ns in namespaces):
    namespaces.append({"type": "uts"})
env = dict(e.split("=", 1) for e in config.get("process", {}).get("env", []) if "=" in e)
prefix = os.path.join(faults, f"{env.get('SLURM_JOB_NAME', '')}.{node}")
shm = f"{prefix}.shm"
if os.path.exists(shm):
    with open(shm) as handle:
        size = handle.read().strip()
    for mount in config.get("mounts", []):
        if mount["destination"] == "/dev/shm":
            mount["options"] = [o for o in mount.get("options", []) if not o.startswith("size=")] + [f"size={size}"]
hosts = f"{prefix}.hosts"
if os.path.exists(hosts):
    for mount in config.get("mounts", []):
        if mount["destination"] == "/etc/hosts":
            mount["source"] = hosts
with open(path, "w") as handle:
    json.dump(config, handle)
delay = f"{prefix}.delay"
# Only the step that trains starts late (its container, as after a slow pull on that node); the
# /dev/shm check before it is not delayed, or it would absorb the skew before the rendezvous.
if os.path.exists(delay) and "torchrun" in config.get("process", {}).get("args", []):
    with open(delay) as handle:
        time.sleep(float(handle.read()))
os.execvp("runc", ["runc", f"--root={root}/runc", "run", cid, "-b", bundle])
