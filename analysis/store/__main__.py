"""``python -m analysis.store repair DIR``, from any Python: it runs in the launcher's
environment (envs/host.txt)."""

import sys

from core.envs import reexec_in_host_env

reexec_in_host_env("analysis.store", sys.argv[1:])

from analysis.store.repair import main  # noqa: E402

sys.exit(main())
