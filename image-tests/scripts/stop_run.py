"""Stop the processes of one rendezvous: SIGTERM every process whose command line names
`--rdzv-id RUN`, or `FLAG RUN` with a second argument FLAG (JAX's `--coordinator HOST:PORT`)
(images need not ship pkill; run with `python3 -I -S`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main() -> int:
    needle = [sys.argv[2] if len(sys.argv) > 2 else "--rdzv-id", sys.argv[1]]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0")]
        except OSError:
            continue
        if any(argv[i:i + 2] == needle for i in range(len(argv) - 1)):
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
