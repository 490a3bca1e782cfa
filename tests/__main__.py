"""`python -m tests [pytest args]`: the project's one test command (README, .ci/run).

Builds (once) the launcher's environment from envs/host.txt, then runs pytest in it. Tests
that need a framework build that framework's environment themselves, so this command is all
the set-up a clean clone needs besides the system packages .ci/run installs.
"""

import sys
from pathlib import Path

from core.envs import reexec_in_host_env

if __name__ == "__main__":
    reexec_in_host_env("tests", sys.argv[1:])
    import pytest

    # Test files or node ids given by the user replace the whole folder.
    arguments = sys.argv[1:]
    chosen = any(Path(arg.split("::")[0]).exists() for arg in arguments
                 if not arg.startswith("-"))
    sys.exit(pytest.main(["-ra", *([] if chosen else ["tests"]),
                          *arguments]))
