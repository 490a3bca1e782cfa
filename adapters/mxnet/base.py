"""What every MXNet module shares: the one import of MXNet, the kvstore names the adapter
accepts, and MXNet's build features.

ps-lite roles: for DMLC_ROLE server or scheduler, `import mxnet` itself runs the role's whole
loop and exits the process. This module imports MXNet with the role masked so its classes can
be defined, and `serve()` then runs the role explicitly.
"""

from __future__ import annotations

import os


def _import_mxnet():
    """Import MXNet as a plain library whatever DMLC_ROLE says (see the module docstring)."""
    role = os.environ.get("DMLC_ROLE")
    if role in ("server", "scheduler"):
        os.environ["DMLC_ROLE"] = "worker"
    try:
        import mxnet  # the one import of MXNet, under the role it must see (above)
    finally:
        if role is not None:
            os.environ["DMLC_ROLE"] = role
    return mxnet


mx = _import_mxnet()
# the adapter's other modules import these from here, after the masked import
from mxnet import autograd, gluon  # noqa: E402,F401
from mxnet.gluon import nn  # noqa: E402,F401

SERVER_MODES = ("dist_sync", "dist_device_sync")
IN_PROCESS_MODES = ("local", "device", "nccl")
KVSTORE_MODES = SERVER_MODES + IN_PROCESS_MODES
REJECTED_MODES = {
    "dist_async": "asynchronous (not comparable with synchronous SGD), and MXNet's servers die "
                  "without a server-side optimizer",
    "dist_device_async": "asynchronous (not comparable with synchronous SGD)",
    "horovod": "MXNet 1.9.1 has no horovod kvstore (kv.create silently returns a local store); "
               "Horovod is its own adapter",
}


def check_mode(mode: str) -> None:
    """Reject kvstore names MXNet would silently turn into a local store."""
    if mode in KVSTORE_MODES:
        return
    why = REJECTED_MODES.get(mode)
    known = ", ".join(KVSTORE_MODES)
    raise ValueError(f"mxnet kvstore {mode!r} is not supported: {why}" if why else
                     f"unknown mxnet kvstore {mode!r} (known: {known}); MXNet itself would "
                     "silently run a local store under that name")


def mxnet_features() -> list[str]:
    features = mx.runtime.Features()
    return sorted(name for name in features.keys() if features.is_enabled(name))


def mkldnn_active() -> bool:
    """MXNet's CPU operators run through MKL-DNN (oneDNN): built in and not switched off."""
    return "MKLDNN" in mxnet_features() and os.environ.get("MXNET_MKLDNN_ENABLED", "1") != "0"
