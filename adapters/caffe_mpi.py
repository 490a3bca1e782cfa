"""Caffe-MPI-style aggregation on PyTorch compute (labelled "Caffe-MPI-style").

Caffe-MPI (the study's Inspur fork of Caffe) overlaps communication with backward: as soon as
backward has produced a layer's gradient, a communication thread all-reduces it over MPI while
backward continues on the earlier layers; the update waits for the last all-reduce. Here the
same: a post-accumulate hook per parameter marks it ready, and one communication thread
all-reduces the parameters with mpi4py in a fixed order (reverse registration order = backward
order), waiting for each to be ready. The fixed order keeps every rank's sequence of
collectives identical, which MPI requires, even if autograd were to reorder two gradients.

On a GPU the gradient goes through a host buffer (Caffe-MPI's default without CUDA-aware MPI).
Started by `mpirun` (launchers/rendezvous/mpi.py); ranks come from OpenMPI's variables.
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from mpi4py import MPI

from adapters.pytorch import TorchTrainer


class LayerwiseAllreducer:
    """The communication thread: all-reduce (average) each gradient once it is ready."""

    def __init__(self, parameters: list, world_size: int, comm):
        self.parameters = list(reversed(parameters))  # backward order
        self.world_size = world_size
        self.comm = comm
        self.ready = {id(p): threading.Event() for p in self.parameters}
        self.start_iteration = threading.Event()
        self.finished = threading.Event()
        self.enabled = False
        self.stopping = False
        self.error: BaseException | None = None
        for parameter in self.parameters:
            parameter.register_post_accumulate_grad_hook(self._mark_ready)
        self.thread = threading.Thread(target=self._loop, name="mpi-allreduce", daemon=True)
        self.thread.start()

    def _mark_ready(self, parameter) -> None:
        if self.enabled:
            self.ready[id(parameter)].set()

    def begin(self) -> None:
        """Called before backward: arm the hooks and release the thread for one iteration."""
        for event in self.ready.values():
            event.clear()
        self.finished.clear()
        self.enabled = True
        self.start_iteration.set()

    def wait(self) -> None:
        """Called after backward: the update may only use fully averaged gradients."""
        self.finished.wait()
        self.enabled = False
        if self.error is not None:
            raise RuntimeError("communication thread failed") from self.error

    def _loop(self) -> None:
        while True:
            self.start_iteration.wait()
            self.start_iteration.clear()
            if self.stopping:
                return
            try:
                for parameter in self.parameters:
                    self.ready[id(parameter)].wait()
                    allreduce_average(parameter.grad, self.comm, self.world_size)
            except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
                self.error = error
            self.finished.set()

    def stop(self) -> None:
        self.stopping = True
        self.start_iteration.set()
        self.thread.join(timeout=10)


def allreduce_average(grad: torch.Tensor, comm, world_size: int) -> None:
    """Sum the gradient over ranks with MPI, then divide by the world size.

    A contiguous CPU gradient is reduced in place in its own memory; a GPU or non-contiguous
    one (channels-last) goes through a contiguous host copy, since MPI needs a plain buffer.
    """
    host = grad.detach().contiguous().cpu()
    comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.SUM)
    if host.data_ptr() != grad.data_ptr():
        grad.copy_(host)
    grad.div_(world_size)


class CaffeMpiStyleTrainer(TorchTrainer):
    def _wrap_distributed(self, network):
        self.comm = MPI.COMM_WORLD
        if self.comm.Get_size() != self.dist.world_size:
            raise RuntimeError(f"MPI world has {self.comm.Get_size()} ranks, "
                               f"the run expects {self.dist.world_size}")
        params = [p for p in network.parameters() if p.requires_grad]
        self.reducer = (LayerwiseAllreducer(params, self.dist.world_size, self.comm)
                        if self.dist.distributed else None)
        return network

    def backward_and_aggregate(self, loss):
        if self.reducer is None:
            loss.backward()
            return
        self.reducer.begin()
        loss.backward()
        self.reducer.wait()

    def backward_local(self, loss):
        loss.backward()  # hooks are not armed: nothing is sent

    def aggregate_after_backward(self):
        """The same layer-wise all-reduces, run after backward on this thread (no overlap)."""
        for parameter in self.reducer.parameters:
            allreduce_average(parameter.grad, self.comm, self.dist.world_size)

    def barrier(self):
        self.comm.Barrier()

    def versions(self):
        return {**super().versions(), "mpi4py": __import__("mpi4py").__version__,
                "mpi": MPI.Get_library_version().splitlines()[0].strip()}

    def describe(self):
        return {**super().describe(), "backend": "mpi" if self.dist.distributed else "none",
                "ddp_bucket_mb": None,
                "scheme": "layer-wise MPI all-reduce from a communication thread during backward"}

    def close(self):
        if self.reducer is not None:
            self.reducer.stop()

    # -- inputs of the performance model (analysis/perfmodel.py) -------------------------------
    def comm_scheme(self):
        """One MPI all-reduce per parameter tensor in reverse registration order, each as soon
        as backward has made it final (WFBP); the separated profile sends the same messages."""
        return {"label": "layer-wise MPI all-reduce", "overlap": True, "granularity": "tensor",
                "profile_granularity": "tensor", "algorithm": "ring", "transport": "mpi"}

    def collective_times(self, sizes, repeats, warmup=2, iters=1):
        """`allreduce_average` of a float32 gradient-like tensor per size, the very call the
        communication thread makes per gradient (host buffer, MPI Allreduce SUM in place,
        divide); each sample: a barrier, then the mean of `iters` back-to-back calls."""
        import time

        if self.comm.Get_size() < 2:
            raise NotImplementedError("one rank has nothing to all-reduce: calibrate with 2 or more workers")
        times = {}
        for nbytes in sizes:
            tensor = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32, device=self.device)
            for _ in range(warmup):
                allreduce_average(tensor, self.comm, self.dist.world_size)
            measured = []
            for _ in range(repeats):
                self.comm.Barrier()
                self.sync()
                start = time.perf_counter()
                for _ in range(iters):
                    allreduce_average(tensor, self.comm, self.dist.world_size)
                self.sync()
                measured.append((time.perf_counter() - start) / iters)
            times[int(nbytes)] = measured
        return times


TRAINER = CaffeMpiStyleTrainer
