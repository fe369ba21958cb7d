"""Proof that a command given to `docker run IMAGE CMD` ran: writes result.json with who ran it."""

from __future__ import annotations

import os
import sys

from probe_io import result

if __name__ == "__main__":
    result({"ran": True, "uid": os.getuid(), "cwd": os.getcwd(), "argv": sys.argv[1:]})
