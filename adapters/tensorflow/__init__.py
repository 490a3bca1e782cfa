"""TensorFlow adapter (CLI name `tf`): the shared model description as TensorFlow ops, one
trainer class per mode (the tf_cnn_benchmarks VariableMgr pattern), chosen in `TRAINERS`.

Modes (the first is the default; every mode with one worker runs the single-device path,
`SingleDeviceTrainer`, so each mode's scaling table has the same 1-worker baseline):
  - `collective` (strategy.py, `CollectiveTrainer`): MultiWorkerMirroredStrategy, one process
    per worker, gradients averaged by collective all-reduce over gRPC (TF_CONFIG from
    launchers/rendezvous/tf.py). TF's default communication options pack every gradient into
    one all-reduce launched once backward has finished (no overlap);
    `options["bytes_per_pack"]` splits the packs so they can overlap.
  - `ps` (ps.py, `SyncPSTrainer`): synchronous parameter servers as the study's TensorFlow ran
    them: TF1 graph mode, variables placed on `--servers N` server processes by
    `replica_device_setter`, `SyncReplicasOptimizer` aggregating one gradient per worker per
    step.
  - `ps-async` (ps_async.py, `AsyncPSTrainer`): TF2 ParameterServerStrategy driven by a
    ClusterCoordinator: asynchronous by design (registered as not synchronous).
  - `mirrored` (strategy.py, `MirroredTrainer`): MirroredStrategy over the GPUs of one process
    (`--workers N` = GPUs); the launcher starts one process. Needs GPUs.

The other modules: model.py (the network as raw `tf.nn` ops over canonically named variables,
and how TF's conventions are matched to Caffe's), inputs.py (tf.data over the JPEG files, the
shared synthetic batches), base.py (threads, layout, GPUs, versions and the one weight loader).
Layout: NHWC by default (TF's CPU kernels exist only for NHWC); NCHW on GPU on request
(`options["layout"]`), refused on CPU with a FrameworkUnavailable message.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's start-up chatter out of stderr tails

from adapters.tensorflow.ps import SyncPSTrainer  # noqa: E402
from adapters.tensorflow.ps_async import AsyncPSTrainer  # noqa: E402
from adapters.tensorflow.strategy import CollectiveTrainer, MirroredTrainer  # noqa: E402

TRAINERS = {"collective": CollectiveTrainer, "ps": SyncPSTrainer, "ps-async": AsyncPSTrainer,
            "mirrored": MirroredTrainer}
