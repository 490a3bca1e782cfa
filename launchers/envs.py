"""`python -m launchers.envs`: an alias of the environment builder, `python -m core.envs`, for
scripts and Dockerfiles that call it by this name.  The builder is `core/envs.py`, at the bottom
layer because every entry point uses it."""

import sys

from core.envs import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
