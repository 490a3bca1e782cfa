"""MXNet adapter: the shared description as a hybridized Gluon HybridBlock, trained by
`gluon.Trainer` over one of MXNet's kvstores (MXNet 1.9.1, the last release).

Modes are kvstore types, chosen on the CLI (`--frameworks mxnet:dist_sync`):

- `dist_sync`, `dist_device_sync`: ps-lite parameter servers, one process per worker. The
  launcher (launchers/rendezvous/dmlc.py) starts a scheduler, `config.servers` servers and the
  workers with the DMLC_* variables; never MXNet's bundled tools/launch.py. Each worker pushes
  its gradients after (and overlapped with) backward; the servers sum them over workers and,
  as MXNet does by default (`update_on_kvstore`), apply the SGD update themselves; the workers
  pull the new weights. So every worker holds the very same bits after a step. Setting
  MXNET_UPDATE_ON_KVSTORE=0 (MXNet's own switch) makes the servers only sum and the workers
  update; the record's `extra` says which ran. With one worker this is an honest 1-worker
  baseline: the same scheduler, server and push/pull, over one worker.
- `local`, `device`, `nccl`: MXNet's in-process data parallelism. ONE process drives
  `workers_per_node` devices (contexts); the kvstore reduces the contexts' gradients in that
  process (`local` on the CPU, `device` on the devices, `nccl` with NCCL, GPU builds only).
  On a CPU the devices are the contexts cpu(0) .. cpu(N-1), each with its own engine worker
  thread and OMP_NUM_THREADS threads. With one device Gluon uses no kvstore at all (its own
  fast path); `extra.kvstore` says "none" then.
- Unknown names are rejected here and in the registry: MXNet's `kv.create` silently returns a
  local store for any name it does not know (`horovod`, typos). `dist_async` is rejected on
  purpose: it is asynchronous (never mixed into synchronous comparisons) and, without an
  optimizer on the servers, its servers die and the workers hang.

The modules: base.py (the one import of MXNet, the kvstore names, MXNet's build features),
model.py (the network as Gluon blocks, and how MXNet's conventions are matched to Caffe's),
inputs.py (synthetic NDArrays, the JPEG files packed into RecordIO), trainer.py
(`MXNetTrainer`: gluon.Trainer over an in-process kvstore, and every mode's iteration), ps.py
(`PSLiteTrainer`: the ps-lite modes, their calibration and the scheduler and server roles).
"""

from adapters.mxnet.ps import PSLiteTrainer
from adapters.mxnet.trainer import MXNetTrainer

TRAINERS = {"dist_sync": PSLiteTrainer, "dist_device_sync": PSLiteTrainer,
            "local": MXNetTrainer, "device": MXNetTrainer, "nccl": MXNetTrainer}
