"""What every TensorFlow mode shares: threads, layout and GPU choice, versions, and the
`TensorFlowTrainer` base with the one weight loader (names checked, canonical arrays converted)."""

from __future__ import annotations

import tensorflow as tf

from adapters.base import DistInfo, FrameworkUnavailable, RunConfig, Trainer


def configure_threads(config: RunConfig) -> None:
    threads = max(1, config.threads_per_worker)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(
        int(config.options.get("inter_op_threads", max(2, threads))))


def choose_layout(config: RunConfig, gpu: bool) -> str:
    """NHWC unless asked otherwise; NCHW only where TF has the kernels (GPU)."""
    asked = config.options.get("layout")
    if asked is None and config.options.get("channels_last"):
        asked = "NHWC"
    layout = (asked or ("NCHW" if gpu else "NHWC")).upper()
    if layout not in ("NHWC", "NCHW"):
        raise FrameworkUnavailable(f"unknown layout {layout!r} for TensorFlow (NHWC or NCHW)")
    if layout == "NCHW" and not gpu:
        raise FrameworkUnavailable(
            "TensorFlow has no NCHW kernels for convolution and pooling on the CPU; "
            "use NHWC (the default on CPU) or run on a GPU")
    return layout


def local_gpus(config: RunConfig, dist: DistInfo) -> list:
    """The GPUs this process uses (one per worker process; all asked ones in `mirrored`)."""
    if config.device != "gpu":
        tf.config.set_visible_devices([], "GPU")
        return []
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise FrameworkUnavailable("--device gpu asked, but TensorFlow sees no GPU "
                                   "(is the CUDA build, tensorflow[and-cuda], installed?)")
    if config.mode == "mirrored":
        wanted = config.workers_per_node
        if len(gpus) < wanted:
            raise FrameworkUnavailable(f"mirrored over {wanted} GPUs asked, TF sees {len(gpus)}")
        chosen = gpus[:wanted]
    else:
        chosen = [gpus[dist.local_rank % len(gpus)]]
    tf.config.set_visible_devices(chosen, "GPU")
    for gpu in chosen:
        tf.config.experimental.set_memory_growth(gpu, True)
    return chosen


def tf_versions() -> dict:
    facts = {"tensorflow": tf.__version__}
    build = tf.sysconfig.get_build_info()
    if build.get("is_cuda_build"):
        facts.update(cuda=str(build.get("cuda_version")), cudnn=str(build.get("cudnn_version")))
    return facts


class TensorFlowTrainer(Trainer):
    """The base of every TensorFlow mode: a profile that traces its own functions before timing
    them, and the weights moved in and out by canonical name (`assign_weights`)."""

    _profile_ready = False

    def profile_step(self, overlapped: bool):
        """See `_profile`. The first call first runs one untimed iteration of each kind: the
        profile's own functions are traced and optimised on first use, which the worker's
        warm-up (of `step`) does not cover. Every rank calls this equally often, so the
        extra iterations keep synchronous ranks in step."""
        if not self._profile_ready:
            self._profile_ready = True
            self._profile(False)
            self._profile(True)
        return self._profile(overlapped)

    def _profile(self, overlapped: bool) -> dict:
        raise NotImplementedError

    def _check_weight_names(self, weights) -> None:
        """Every parameter and buffer of the model, nothing else: a mismatch is a bug in the
        caller or the model, said with the first names on each side."""
        expected = set(self.params) | set(self.buffers)
        missing, unexpected = expected - set(weights), set(weights) - expected
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")

    def load_weights(self, weights):
        """Weights in, momenta zeroed (the graph-mode ps trainer overrides it)."""
        self.assign_weights(weights)
        for slot in self.slots.values():
            slot.assign(tf.zeros_like(slot))

    def assign_weights(self, weights, assign=lambda variable, value: variable.assign(value)) -> None:
        """Set every parameter and buffer from canonical arrays (checked first), converted to the
        model's TF layout; `assign(variable, value)` is how this mode writes a variable."""
        self._check_weight_names(weights)
        for name, variable in {**self.params, **self.buffers}.items():
            assign(variable, self.model.to_tf(name, weights[name]))

    def export_weights(self):
        return {name: self.model.to_canonical(name, value)
                for name, value in self._read_variables({**self.params, **self.buffers}).items()}

    def _read_variables(self, variables: dict) -> dict:
        """Variable values as NumPy, by name (eager modes read them directly)."""
        return {name: variable.numpy() for name, variable in variables.items()}
