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
import time

import numpy as np
import torch
from mpi4py import MPI

from adapters.base import MessageLog
from adapters.pytorch import TorchTrainer


class LayerwiseAllreducer:
    """The communication thread: all-reduce (average) each gradient once it is ready."""

    def __init__(self, parameters: list, world_size: int, comm, names: dict[int, str]):
        self.parameters = list(reversed(parameters))  # backward order
        self.names = names  # id(parameter) -> its name, for the trace's messages
        self.log = MessageLog()
        self.world_size = world_size
        self.comm = comm
        self.ready = {id(p): threading.Event() for p in self.parameters}
        self.start_iteration = threading.Event()
        self.backward_done = threading.Event()  # from then on nothing competes for the cores
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
        self.log.clear()
        self.backward_done.clear()
        self.finished.clear()
        self.enabled = True
        self.start_iteration.set()

    def wait(self) -> None:
        """Called after backward: the update may only use fully averaged gradients."""
        self.backward_done.set()
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
                self._allreduce_as_ready()
            except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
                self.error = error
            self.finished.set()

    def _allreduce_as_ready(self) -> None:
        """All-reduce every gradient in backward order, each as soon as every rank has it.

        The ranks agree on how far they all are (`agree_politely`), then all-reduce that run
        of gradients one by one; so an all-reduce never waits, spinning, for a peer still in
        backward, and one agreement covers all the gradients that became ready meanwhile."""
        done = 0
        while done < len(self.parameters):
            self.ready[id(self.parameters[done])].wait()  # sleeps: no MPI call yet
            ready_here = done + 1
            while (ready_here < len(self.parameters)
                   and self.ready[id(self.parameters[ready_here])].is_set()):
                ready_here += 1
            ready_everywhere = agree_politely(self.comm, ready_here, self.backward_done)
            for parameter in self.parameters[done:ready_everywhere]:
                self.send(parameter)
            done = ready_everywhere

    def send(self, parameter) -> None:
        """One layer-wise all-reduce, timed for the trace."""
        grad = parameter.grad
        self.log.timed(self.names[id(parameter)], grad.numel() * grad.element_size(),
                       lambda: allreduce_average(grad, self.comm, self.world_size))

    def stop(self) -> None:
        self.stopping = True
        self.start_iteration.set()
        self.thread.join(timeout=10)


POLL_INTERVAL_S = 50e-6


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


def agree_politely(comm, ready_here: int, backward_done: threading.Event) -> int:
    """How many gradients (in backward order) every rank has ready: the minimum of
    `ready_here` over ranks, by a non-blocking all-reduce tested with short sleeps between
    tests while this rank's backward still runs, and waited for MPI's own way after.

    A blocking MPI call busy-polls its progress engine for the whole wait, and a rank's
    layer-wise all-reduce mostly waits for the peer that is still in backward. In Caffe-MPI on
    GPUs that spin is harmless: backward runs on the device. Here backward needs the same CPU
    cores, and a communication thread spinning in MPI_Allreduce took them: 2 ranks of
    googlenet-tiny on 2 cores ran 1.7 s per iteration with overlap 0.0. Agreeing politely
    first leaves the cores to backward until data can move; each all-reduce is then the
    ordinary blocking one (a non-blocking all-reduce of the gradient itself advances only
    inside MPI calls: tested every 50 us it ran a 32 MB message at half speed and hid nothing
    of AlexNet's). One agreement per run of ready gradients, not per gradient, keeps the
    sleeps' wake-up latency off GoogleNet's hundred-odd small tensors."""
    mine = np.array([ready_here], dtype=np.int64)
    everyone = np.empty_like(mine)
    request = comm.Iallreduce(mine, everyone, op=MPI.MIN)
    while not backward_done.is_set():
        if request.Test():
            return int(everyone[0])
        time.sleep(POLL_INTERVAL_S)
    request.Wait()
    return int(everyone[0])


class CaffeMpiStyleTrainer(TorchTrainer):
    def _wrap_distributed(self, network):
        self.comm = MPI.COMM_WORLD
        if self.comm.Get_size() != self.dist.world_size:
            raise RuntimeError(f"MPI world has {self.comm.Get_size()} ranks, "
                               f"the run expects {self.dist.world_size}")
        named = [(name, p) for name, p in network.named_parameters() if p.requires_grad]
        self.reducer = (LayerwiseAllreducer([p for _, p in named], self.dist.world_size, self.comm,
                                            {id(p): name for name, p in named})
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
        self.reducer.log.clear()
        for parameter in self.reducer.parameters:
            self.reducer.send(parameter)

    def last_messages(self):
        return self.reducer.log.messages if self.reducer is not None else None

    def barrier(self):
        self.comm.Barrier()

    def any_rank(self, flag):
        return bool(self.comm.allreduce(int(flag)))

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
    def comm_transport(self):
        return "mpi"  # one MPI all-reduce per tensor, in reverse registration order

    def contention_probe(self, rounds):
        """TorchTrainer's probe, but the sending half arms this scheme's own communication
        thread (`LayerwiseAllreducer.begin`, as `backward_and_aggregate` does) instead of
        submitting copies from tensor hooks: the thread, its polite agreement and the GIL it
        shares with backward are what contend here.  Measured without it, the model
        under-predicted this scheme by 10-20% on 2 cores (no contention assumed)."""
        if self.reducer is None:
            raise NotImplementedError("one rank sends nothing: calibrate with 2 or more workers")
        return super().contention_probe(rounds)

    def _probe_backward(self, params, submit):
        if submit:
            self.reducer.begin()  # forward fires no gradient hooks: the thread waits for backward's
        return super()._probe_backward(params, False)

    def _probe_wait(self, handles):
        super()._probe_wait(handles)
        if self.reducer.enabled:
            self.reducer.wait()

    def submit_collective(self, tensor, name):
        """The probe's replay: the communication thread's own call (blocking), at once."""
        allreduce_average(tensor, self.comm, self.dist.world_size)

    def wait_collective(self, handle):
        """`submit_collective` has already finished."""

    def collective_call(self, nbytes):
        """`allreduce_average` of a float32 gradient-like tensor, the very call the
        communication thread makes per gradient (host buffer, MPI Allreduce SUM in place,
        divide)."""
        if self.comm.Get_size() < 2:
            raise NotImplementedError("one rank has nothing to all-reduce: calibrate with 2 or more workers")
        tensor = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32, device=self.device)
        return lambda: allreduce_average(tensor, self.comm, self.dist.world_size)


TRAINERS = {"mpi": CaffeMpiStyleTrainer}
