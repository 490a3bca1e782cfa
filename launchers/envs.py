"""`python -m launchers.envs`: the environment builder's command under its earlier module name,
kept so that scripts and Dockerfiles written against it keep working.  The builder is
`core/envs.py` (`python -m core.envs`), at the bottom layer because every entry point uses it."""

import sys

from core.envs import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
