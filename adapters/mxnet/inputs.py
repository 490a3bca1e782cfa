"""The batches an MXNet trainer steps on: synthetic NDArrays, or the JPEG files through
RecordIO and `mx.io.ImageRecordIter`.

Synthetic batches (adapters/data.py) are turned into NDArrays on their devices
once, so the timed loop measures MXNet, as torch's zero-copy `from_numpy` does. The generated
JPEG files go through MXNet's own fast path: the project packs the very JPEG bytes (no
re-encoding) into an indexed RecordIO file once, next to the data set, and
`mx.io.ImageRecordIter` reads it: C++ threads decode (OpenCV), centre-crop and normalise in
the worker process, with a prefetch buffer, sharded across workers by num_parts/part_index.
Chosen over Gluon's ImageFolderDataset + DataLoader because that is MXNet's production path
(ImageNet training reads RecordIO made by im2rec, as the study's era did), it needs no
forked Python loader processes (fork and MXNet's engine threads do not mix well, and there is
nothing to leave behind when a run is killed), and it shards natively for distributed runs.
`loader_workers` sets its decode threads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from adapters.base import DistInfo, RunConfig
from adapters.data import Cycle, SyntheticBatches, list_jpeg_dataset
from adapters.mxnet.base import mx
from core.files import file_lock


class SyntheticNDArrays(Cycle):
    """SyntheticBatches turned into NDArrays once, cycled forever; each batch is a list with
    one slice per context.

    With several contexts (in-process modes) the process draws the global batch and context i
    takes rows i*b .. (i+1)*b - 1: the same samples rank i of a multi-process run gets. The
    slices live in host memory as the PyTorch adapter's do: on their CPU context itself, or
    pinned for a GPU (the h2d phase copies them there).
    """

    def __init__(self, spec, batch_per_context: int, contexts, rank: int, world_size: int,
                 seed: int):
        count = len(contexts)
        source = SyntheticBatches(spec, batch_per_context * count, rank, world_size, seed)
        hosts = [c if c.device_type == "cpu" else mx.cpu_pinned(0) for c in contexts]
        batches = []
        for images, labels in source.batches:
            rows = [slice(i * batch_per_context, (i + 1) * batch_per_context)
                    for i in range(count)]
            batches.append((
                [mx.nd.array(images[r], ctx=h) for r, h in zip(rows, hosts)],
                [mx.nd.array(labels[r], ctx=h, dtype="float32") for r, h in zip(rows, hosts)]))
        super().__init__(batches)


def recordio_paths(data_dir: str) -> tuple[Path, Path]:
    """Where the packed RecordIO of a generated JPEG data set lives: beside its folder."""
    root = Path(data_dir).resolve()
    folder = root.with_name(root.name + ".mxnet-recordio")
    return folder / "data.rec", folder / "data.idx"


def pack_recordio(data_dir: str) -> tuple[Path, Path]:
    """Pack the data set's JPEG files, bytes unchanged, into an indexed RecordIO (once).

    Written into a temporary folder and renamed under a file lock, so concurrent workers pack
    it once and an interrupted packing never leaves a half file that looks done.
    """
    rec, idx = recordio_paths(data_dir)
    folder = rec.parent
    if (folder / "complete").exists():
        return rec, idx
    with file_lock(folder.with_suffix(".lock")):
        if (folder / "complete").exists():
            return rec, idx
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        items = list_jpeg_dataset(data_dir)
        writer = mx.recordio.MXIndexedRecordIO(str(partial / idx.name),
                                               str(partial / rec.name), "w")
        for index, (path, label) in enumerate(items):
            header = mx.recordio.IRHeader(0, float(label), index, 0)
            writer.write_idx(index, mx.recordio.pack(header, Path(path).read_bytes()))
        writer.close()
        (partial / "complete").write_text(f"{len(items)} images from {data_dir}\n")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return rec, idx


class RecordBatches:
    """ImageRecordIter over the packed files, forever; each batch split over the contexts.

    Yields CPU NDArrays (the h2d phase moves them to their contexts). The iterator decodes,
    centre-crops to the model's input and normalises (x - 128) / 64 as adapters/data.py does.
    """

    def __init__(self, spec, config: RunConfig, dist: DistInfo, contexts):
        rec, idx = pack_recordio(config.data_dir)
        images = len(list_jpeg_dataset(config.data_dir))
        if images < config.global_batch:
            raise ValueError(f"data set of {images} images is smaller than the global "
                             f"batch {config.global_batch}")
        self.contexts = contexts
        self.iterator = mx.io.ImageRecordIter(
            path_imgrec=str(rec), path_imgidx=str(idx), data_shape=spec.input_shape,
            batch_size=config.batch_per_worker * len(contexts), shuffle=True,
            seed=config.seed, num_parts=dist.world_size, part_index=dist.rank,
            preprocess_threads=max(1, config.loader_workers), prefetch_buffer=4,
            rand_crop=False, rand_mirror=False, round_batch=True, label_width=1,
            mean_r=128.0, mean_g=128.0, mean_b=128.0, std_r=64.0, std_g=64.0, std_b=64.0,
            dtype="float32", ctx="cpu", verbose=False)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            batch = self.iterator.next()
        except StopIteration:
            self.iterator.reset()
            batch = self.iterator.next()
        return batch.data[0], batch.label[0]
