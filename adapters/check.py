"""`python -m adapters.check`: an alias of the equivalence check, `python -m launchers.check`
(`dlcompare check`), for scripts that call it by this name.  The check starts runs, so it lives
with the launchers; this module hands over to it in a new process (the same interpreter and
arguments) rather than importing up the layers."""

import os
import sys

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "-m", "launchers.check", *sys.argv[1:]])
