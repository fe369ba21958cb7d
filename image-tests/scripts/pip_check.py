"""`pip check` with the image's own Python: does every installed distribution have what it
requires, at a version it accepts? Writes {"pip": version or "", "rc", "problems": [lines],
"error"} to result.json; the test decides. Offline (pip reads the installed metadata only) and with
no pip configuration of the image's (PIP_CONFIG_FILE=/dev/null): only what is installed counts.
Standard library only, Python 3.8 syntax."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys

from probe_io import result

OK_LINE = "No broken requirements found."
# The lines pip check prints for a problem (pip 20 to 26); anything else on its stdout is the image's
# own start-up talk (a sitecustomize or .pth hook that prints), never a finding.
PROBLEM = re.compile(r"^\S+ \S+ (requires .*, which is not installed\.|has requirement .*, but you have .*"
                     r"|is not supported on this platform\.?)$")


def main() -> int:
    if importlib.util.find_spec("pip") is None:
        result({"pip": "", "rc": None, "problems": [], "error": f"pip is not installed for {sys.executable}"})
        return 0
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    run = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, env=env,
                         timeout=300)
    lines = [line.strip() for line in run.stdout.splitlines() if line.strip()]
    problems = [line for line in lines if PROBLEM.match(line)]
    error = ""
    if run.returncode == 0 and problems:
        error = f"`pip check` exited 0 but named problems: {' | '.join(problems)[:400]}"
    elif run.returncode != 0 and not problems:
        tail = [line.strip() for line in run.stderr.splitlines() if line.strip()][-3:]
        error = f"`pip check` exited {run.returncode} without naming a problem: {' | '.join(tail)[:400]}"
    elif run.returncode == 0 and OK_LINE not in lines:
        error = f"`pip check` exited 0 but did not say {OK_LINE!r}: {' | '.join(lines)[:400]}"
    result({"pip": importlib.metadata.version("pip"), "rc": run.returncode, "problems": problems,
            "error": error})
    return 0


if __name__ == "__main__":
    sys.exit(main())
