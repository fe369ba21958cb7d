import sys

from tests.slurmcluster import main

sys.exit(main(sys.argv[1:]))
