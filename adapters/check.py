"""`python -m adapters.check`: the equivalence check's command under its earlier module name,
kept so that scripts written against it keep working.  The check starts runs, so it lives with
the launchers (`python -m launchers.check`, `dlcompare check`); this module hands over to it in
a new process (the same interpreter and arguments) rather than importing up the layers."""

import os
import sys

if __name__ == "__main__":
    os.execv(sys.executable, [sys.executable, "-m", "launchers.check", *sys.argv[1:]])
