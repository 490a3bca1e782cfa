"""CNTK-style aggregation on PyTorch compute (labelled "CNTK-style", not CNTK itself).

CNTK's data-parallel SGD (the study's CNTK 2.x with NCCL) waits until backward has produced
every gradient, then all-reduces the whole gradient in one step, then updates: no overlap of
communication with backward. Here: the same network and input pipeline as the PyTorch adapter,
no DDP, and one flat all-reduce over gloo (CPU) or NCCL (GPU) after backward.
"""

from __future__ import annotations

import torch.distributed as dist

from adapters.pytorch import TorchTrainer


class CntkStyleTrainer(TorchTrainer):
    def _wrap_distributed(self, network):
        if self.dist.distributed:
            dist.init_process_group(self.backend, rank=self.dist.rank,
                                    world_size=self.dist.world_size)
        return network  # no DDP: nothing communicates during backward

    def backward_and_aggregate(self, loss):
        loss.backward()
        if self.dist.distributed:
            self.aggregate_after_backward()

    def backward_local(self, loss):
        loss.backward()

    def describe(self):
        return {**super().describe(), "ddp_bucket_mb": None,
                "scheme": "whole gradient all-reduced once after backward (no overlap)"}


TRAINERS = {"allreduce": CntkStyleTrainer}
