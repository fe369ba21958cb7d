"""What the image tests need from a run profile, and how long validating an image may take.

The matrix refuses a profile below these (buildtool/matrix), validate and the image tests
name them in their messages, so the three agree on one number. Sizes are Docker's, in the one
size grammar (buildtool.common.sizes).
"""

from __future__ import annotations

# /dev/shm below this makes DataLoader workers and NCCL die with bus errors on real batches;
# the image tests pass 96 MiB batches through it with two workers.
MIN_SHM_BYTES = 1 << 30
MIN_SHM_SIZE = "1g"

# The whole image's budget for its tests, unless the matrix's `validate.deadline_s` says otherwise:
# a CPU image passes in about two minutes here; GPU images run NCCL DDP, bus bandwidth and
# a two-node rendezvous whose peer may be late.
DEFAULT_DEADLINE_S = {"cpu": 480, "cuda": 1500}
MAX_DEADLINE_S = 3 * 3600
