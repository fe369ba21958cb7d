"""/dev/shm: as large as the run profile promises (and at least 1 GiB), and worker processes
can pass batches larger than Docker's 64 MB default through it."""

from __future__ import annotations

from harness import human


def test_shm_size_matches_run_profile(main, target):
    mount = main.testinfra().mount_point("/dev/shm")
    assert mount.exists, "/dev/shm is not mounted in the container"
    size = int(main.exec("df -B1 --output=size /dev/shm | tail -1", timeout=30).out.strip())
    need = int(target["shm_expected_bytes"])
    assert size >= need, (
        f"/dev/shm is {human(size)} but the run profile promises {target['shm_promised']} "
        f"(at least {human(need)}): DataLoader workers and NCCL die with a bus error; "
        f"start the container with --shm-size={target['shm_promised']}")


def test_workers_pass_large_batches_through_shm(main, target):
    mode = target["framework_info"]["shm_workers"]
    what = "a DataLoader with 2 workers" if mode == "torch" else "2 worker processes"
    result = main.python("shm_workers.py", mode, timeout=240)
    if result.rc != 0 or "SHM_OK" not in result.out:
        text = result.text
        cause = ("out of shared memory (bus error)" if "Bus error" in text or "shared memory" in text
                 or "SIGBUS" in text else f"exit code {result.rc}")
        size = main.exec("df -h --output=size /dev/shm | tail -1", timeout=30).out.strip()
        raise AssertionError(f"{what} could not pass 96 MiB batches through /dev/shm ({size}): {cause}\n"
                             f"{result.tail(6)}")
