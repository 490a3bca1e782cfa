"""The part of the CNTK adapter that runs inside CNTK 2.7's own Python (3.5/3.6).

Started by adapters/cntk.py (Python 3.11) as `DLC_BACKEND_PYTHON adapters/cntk_backend.py` and
driven over a JSON-lines protocol: one request per line on stdin, one reply per line on the
original stdout. CNTK prints banners on stdout, so the protocol gets a private copy of that
file descriptor and fd 1 is pointed at stderr before CNTK is imported.

Self-contained on purpose: it imports only cntk, numpy and the standard library and is written
for Python 3.6 (no dataclasses, no postponed annotations), because dlcompare's own packages need
Python 3.10+. Arrays cross the boundary as .npz files in dlcompare's canonical layout (conv
OIHW, linear (out, in), NCHW flatten); this module converts to and from CNTK's layout.

Requests ({"op": NAME, ...}) and replies ({"ok": true, ...} or {"ok": false, "error": LINE,
"kind": "unavailable" | "error"}):
  hello                          versions, or why CNTK cannot run here (kind unavailable)
  build {model, options}         the network, loss, learner (and MPI distributed learner)
  load_weights {path}            canonical npz -> parameters and BN statistics
  export_weights {path}          parameters and BN statistics -> canonical npz
  set_batches {path}             npz of images (P, N, C, H, W) and labels (P, N): the batches
                                 step() and profile() cycle through
  step {n}                       n iterations on CNTK's fast path (Trainer.train_minibatch)
  profile {distributed_comm}     one iteration, phases timed separately (see `profile`)
  gradients {path, out}          loss and local gradients of the mean loss on one batch
  loss                           mean loss of the latest iteration
  collective {sizes, repeats}    seconds of CNTK's MPI all-reduce per message size
  barrier, noop, close
"""

import ctypes
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

# This file sits beside adapters/cntk.py, and a script's folder comes first on sys.path: without
# this, `import cntk` would find dlcompare's adapter instead of CNTK.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

SHIM_VAR = "DLC_CNTK_MPI_SHIM"
# OpenMPI 1.10's sonames, which CNTK 2.7's libraries were linked against.
WANTED = (("libmpi.so.12", "libmpi.so"), ("libmpi_cxx.so.1", "libmpi_cxx.so"))
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
            "/usr/lib/x86_64-linux-gnu/openmpi/lib", "/usr/lib64/openmpi/lib")
# BatchNorm running statistics: CNTK blends the first minibatches in by count
# (factor max(1 - exp(-N / T), N / (count + N))); a large initial count leaves the pure
# exponential average running = m * running + (1 - m) * batch that the other frameworks use.
BN_COUNT = 1e9


class Unavailable(RuntimeError):
    """CNTK cannot run on this machine (missing library, wrong interpreter)."""


# --------------------------------------------------------------------------- MPI library shim

def system_library(prefix):
    """Path of the newest OpenMPI lib<prefix>.so.N in ldconfig's cache or the usual library
    folders, or None."""
    found = []
    try:
        listing = subprocess.check_output(["ldconfig", "-p"], stderr=subprocess.DEVNULL,
                                          universal_newlines=True)
        found = re.findall(r"\s(" + re.escape(prefix) + r"\.(\d+)) .*=> (\S+)", listing)
        found = [(int(n), path) for _, n, path in found]
    except (OSError, ValueError):
        pass
    for folder in LIB_DIRS:
        for path in glob.glob(os.path.join(folder, prefix + ".[0-9]*")):
            match = re.match(re.escape(prefix) + r"\.(\d+)$", os.path.basename(path))
            if match:
                found.append((int(match.group(1)), path))
    found = [(n, p) for n, p in found if os.path.exists(p) and is_openmpi(p)]
    return max(found)[1] if found else None


def is_openmpi(library):
    """Whether a libmpi is OpenMPI's (MPICH's libmpi.so.12 has the same soname as OpenMPI
    1.10's but another ABI: its handles are ints, OpenMPI's are pointers to these symbols)."""
    try:
        return hasattr(ctypes.CDLL(library), "ompi_mpi_comm_world")
    except OSError:
        return False


def ensure_mpi_shim():
    """Make OpenMPI 1.10's sonames resolvable, re-executing this process once if needed.

    Where the real sonames load (an OpenMPI 1.10 install) nothing is done. Otherwise a private
    folder of symlinks (libmpi.so.12 -> the system's libmpi.so.N, libmpi_cxx.so.1 -> its
    libmpi_cxx.so.N) is put first on LD_LIBRARY_PATH; the dynamic loader reads that variable
    only at start, hence the exec. The folder lives in this environment (sys.prefix)."""
    if os.environ.get(SHIM_VAR):
        return os.environ[SHIM_VAR]
    try:
        for soname, _ in WANTED:
            ctypes.CDLL(soname)
        if is_openmpi(WANTED[0][0]):
            return "system"  # a real OpenMPI 1.10
    except OSError:
        pass
    targets = {}
    for soname, prefix in WANTED:
        path = system_library(prefix)
        if path is None:
            raise Unavailable("CNTK needs OpenMPI's shared libraries (%s, %s) and none are "
                              "installed: apt-get install libopenmpi3"
                              % (WANTED[0][1], WANTED[1][1]))
        targets[soname] = os.path.realpath(path)
    folder = os.path.join(sys.prefix, "mpi-shim")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        folder = os.path.join(tempfile.gettempdir(), "dlc-cntk-mpi-shim-%d" % os.getuid())
        os.makedirs(folder, exist_ok=True)
    for soname, target in targets.items():
        link = os.path.join(folder, soname)
        if os.path.realpath(link) != target:  # atomic, so concurrent ranks never see a gap
            temporary = "%s.%d" % (link, os.getpid())
            os.symlink(target, temporary)
            os.replace(temporary, link)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (folder, env.get("LD_LIBRARY_PATH", "")) if p)
    env[SHIM_VAR] = folder
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


# --------------------------------------------------------------------------- the network

class Network(object):
    """dlcompare's layer tree (as JSON from adapters/cntk.py) built with CNTK's ops.

    Conventions checked against PyTorch (tests/test_cntk.py): CNTK's convolution kernel is
    OIHW like the canonical layout and supports groups on the CPU; its auto-padding equals an
    explicit pad of kernel//2 for odd kernels (any stride); Caffe's ceil-mode pooling is
    `ceil_out_dim=True` without padding, and 'same' pooling with padding kernel//2 at stride 1;
    its LRN takes Caffe's alpha (it divides by the window itself) and the half-width;
    its BatchNorm keeps the unbiased running variance like PyTorch, with the averaging
    factor 1 - exp(-N / T), so T = -N / ln(momentum).
    """

    def __init__(self, C, np, model, options):
        self.C, self.np = C, np
        self.options = options
        self.batch = int(options["batch"])
        self.dropout = bool(options.get("dropout", True))
        self.seed = int(options.get("seed", 0))
        self.expected = {k: tuple(v) for k, v in model["output_shapes"].items()}
        self.params = {}  # canonical name -> (cntk Parameter, kind)
        self.buffers = {}  # canonical name -> cntk Constant
        self.order = []  # canonical names in forward order
        self.dropouts = 0
        self.features = C.input_variable(tuple(model["input_shape"]), np.float32,
                                         name="features")
        self.labels = C.input_variable((int(model["num_classes"]),), np.float32, name="labels")
        self.output = self.node(model["root"], self.features)
        self.loss = C.cross_entropy_with_softmax(self.output, self.labels)

    # -- helpers
    def check(self, node, value):
        want = self.expected.get(node["name"])
        got = tuple(int(d) for d in value.shape)
        if want is not None and got != want:
            raise ValueError("%s: CNTK gives shape %s, the description %s"
                             % (node["name"], got, want))
        return value

    def parameter(self, name, shape, kind):
        param = self.C.parameter(shape=tuple(shape), init=0.0, name=name)
        self.params[name] = (param, kind)
        self.order.append(name)
        return param

    def constant(self, name, shape, value):
        const = self.C.constant(value=self.np.full(tuple(shape), value, self.np.float32),
                                name=name)
        self.buffers[name] = const
        self.order.append(name)
        return const

    # -- the tree
    def node(self, node, x):
        kind = node["type"]
        if kind == "Sequential":
            for child in node["layers"]:
                x = self.node(child, x)
            return x
        if kind == "Concat":
            outs = [self.node(branch, x) for branch in node["branches"]]
            return self.check(node, self.C.splice(*outs, axis=0))
        if kind == "Residual":
            body = self.node(node["body"], x)
            short = x if node["shortcut"] is None else self.node(node["shortcut"], x)
            return self.check(node, self.C.plus(body, short))
        builder = getattr(self, "leaf_" + kind, None)
        if builder is None:
            raise ValueError("no CNTK builder for %s" % kind)
        return self.check(node, builder(node, x))

    def leaf_Conv2d(self, node, x):
        C = self.C
        name, k, stride, pad = node["name"], node["kernel"], node["stride"], node["pad"]
        groups = node["groups"]
        channels = x.shape[0]
        weight = self.parameter(name + ".weight",
                                (node["out_channels"], channels // groups, k, k), "conv")
        if pad == 0:
            auto = False
        elif k % 2 == 1 and pad == k // 2 and k <= min(x.shape[1:]):
            auto = True  # centred windows: the same as an explicit pad of k//2
        else:  # CNTK's auto padding also refuses a kernel larger than the unpadded input
            x = C.pad(x, [(0, 0), (pad, pad), (pad, pad)])
            auto = False
        y = C.convolution(weight, x, strides=(1, stride, stride),
                          auto_padding=[False, auto, auto], groups=groups)
        if node["bias"]:
            y = y + self.parameter(name + ".bias", (node["out_channels"], 1, 1), "conv_bias")
        return y

    def leaf_Pool2d(self, node, x):
        C = self.C
        kind = C.MAX_POOLING if node["mode"] == "max" else C.AVG_POOLING
        if node["global_pool"]:
            return C.pooling(x, kind, tuple(x.shape[1:]), strides=(1, 1))
        k, stride, pad = node["kernel"], node["stride"], node["pad"]
        if pad == 0:  # Caffe's ceil rule: the last window may hang over the edge
            return C.pooling(x, kind, (k, k), strides=(stride, stride),
                             auto_padding=[False, False], ceil_out_dim=True)
        if stride == 1 and k % 2 == 1 and pad == k // 2:  # same size, Caffe counts the pad
            if k <= min(x.shape[1:]):
                return C.pooling(x, kind, (k, k), strides=(1, 1),
                                 auto_padding=[False, True, True], include_pad=True)
            # CNTK refuses a window larger than the input: pad explicitly (max ignores the
            # lowest float, average divides by the whole window as Caffe does here)
            fill = float(self.np.finfo(self.np.float32).min) if node["mode"] == "max" else 0.0
            x = C.pad(x, [(0, 0), (pad, pad), (pad, pad)], constant_value=fill)
            return C.pooling(x, kind, (k, k), strides=(1, 1), auto_padding=[False, False])
        raise ValueError("%s: CNTK has no exact translation of a padded strided pool "
                         "(kernel %d, stride %d, pad %d)" % (node["name"], k, stride, pad))

    def leaf_LRN(self, node, x):
        return self.C.local_response_normalization(x, node["size"] // 2, node["k"],
                                                   node["alpha"], node["beta"])

    def leaf_ReLU(self, node, x):
        return self.C.relu(x)

    def leaf_Dropout(self, node, x):
        if not self.dropout or node["p"] <= 0:
            return x
        self.dropouts += 1
        return self.C.dropout(x, node["p"], seed=self.seed * 1000 + self.dropouts)

    def leaf_BatchNorm(self, node, x):
        name, channels = node["name"], x.shape[0]
        momentum = float(node["momentum"])
        if momentum <= 0.0:
            time_constant = 0.0  # CNTK: running statistics = the latest batch's
        elif momentum >= 1.0:
            time_constant = float("inf")  # never updated
        else:
            time_constant = -self.batch / math.log(momentum)
        scale = self.parameter(name + ".weight", (channels,), "bn")
        bias = self.parameter(name + ".bias", (channels,), "bn")
        mean = self.constant(name + ".running_mean", (channels,), 0.0)
        var = self.constant(name + ".running_var", (channels,), 1.0)
        count = self.C.constant(BN_COUNT, shape=(), name=name + ".count")
        return self.C.batch_normalization(x, scale, bias, mean, var, spatial=True,
                                          normalization_time_constant=time_constant,
                                          epsilon=node["eps"], running_count=count)

    def leaf_Linear(self, node, x):
        name = node["name"]
        weight = self.parameter(name + ".weight", (x.shape[0], node["out_features"]), "linear")
        y = self.C.times(x, weight)
        if node["bias"]:
            y = y + self.parameter(name + ".bias", (node["out_features"],), "linear_bias")
        return y

    def leaf_Flatten(self, node, x):
        size = 1
        for d in x.shape:
            size *= d
        return self.C.reshape(x, (size,))  # row-major: the canonical (C, H, W) order

    # -- layouts
    def to_cntk(self, name, array):
        kind = self.params[name][1] if name in self.params else "buffer"
        if kind == "linear":
            return self.np.ascontiguousarray(array.T)  # (out, in) -> (in, out)
        if kind == "conv_bias":
            return array.reshape(-1, 1, 1)
        return array

    def to_canonical(self, name, array):
        kind = self.params[name][1] if name in self.params else "buffer"
        if kind == "linear":
            return self.np.ascontiguousarray(array.T)
        if kind == "conv_bias":
            return array.reshape(-1)
        return array


# --------------------------------------------------------------------------- the backend

class Backend(object):
    def __init__(self, shim):
        self.shim = shim
        self.C = self.np = None
        self.net = None
        self.batches = []
        self.position = 0
        self.last_loss = float("nan")
        self.communicator = None

    def op_hello(self, request):
        # CNTK warns on import that this is not Ubuntu and that GPU libraries are missing
        warnings.filterwarnings("ignore", module="cntk")
        # imported at the first request, once the MPI shim is on the library path: a failed
        # import is then the answer to `hello`, not a dead backend
        import numpy
        import cntk
        self.C, self.np = cntk, numpy
        try:
            cntk.device.try_set_default_device(cntk.device.cpu())
        except Exception:  # noqa: BLE001 - an old build without the call: CPU anyway
            pass
        versions = {"cntk": cntk.__version__, "cntk_python": sys.version.split()[0],
                    "cntk_numpy": numpy.__version__,
                    "cntk_mpi": os.path.realpath(os.path.join(self.shim, "libmpi.so.12"))
                    if self.shim not in ("", "system") else self.shim,
                    "cntk_threads": str(cntk.cntk_py.get_max_num_cputhreads())}
        return {"versions": versions}

    def op_build(self, request):
        C = self.C
        options = request["options"]
        threads = int(options.get("threads", 0))
        if threads > 0:
            C.cntk_py.set_max_num_cputhreads(threads)
        self.net = net = Network(C, self.np, request["model"], options)
        params = [net.params[name][0] for name in net.order if name in net.params]
        world = int(options.get("world_size", 1))
        # momentum_sgd with unit_gain=False: v = m*v + g; w -= lr*v (PyTorch's SGD). The
        # trainer hands the learner the gradient of the *sum* of per-sample losses with the
        # sample count (aggregated over workers when distributed); minibatch_size = the global
        # batch makes CNTK scale the rate to lr / global batch, i.e. lr on the mean gradient.
        global_batch = int(options["batch"]) * world
        learner = local = C.momentum_sgd(
            params, lr=C.learning_parameter_schedule(float(options["lr"]),
                                                     minibatch_size=global_batch),
            momentum=C.momentum_schedule(float(options["momentum"]), minibatch_size=global_batch),
            unit_gain=False, minibatch_size=global_batch)
        if world > 1:
            learner = C.train.distributed.data_parallel_distributed_learner(
                learner, distributed_after=0, num_quantization_bits=32)
            self.communicator = learner.communicator()
            if self.communicator.num_workers() != world:
                raise RuntimeError("MPI gives %d workers, the run wants %d"
                                   % (self.communicator.num_workers(), world))
        self.local_learner, self.learner = local, learner
        self.trainer = C.Trainer(net.output, (net.loss, None), [learner])
        self.params = params
        facts = {"parameters": len(params), "buffers": len(net.buffers),
                 "cntk_threads": str(C.cntk_py.get_max_num_cputhreads())}
        if self.communicator is not None:
            facts["mpi_rank"] = self.communicator.rank()
            facts["mpi_workers"] = self.communicator.num_workers()
        return facts

    def op_load_weights(self, request):
        net = self.net
        with self.np.load(request["path"]) as data:
            arrays = dict((name, data[name]) for name in data.files)
        missing = [n for n in net.order if n not in arrays]
        unexpected = [n for n in arrays if n not in net.params and n not in net.buffers]
        if missing or unexpected:
            raise ValueError("weights do not fit the model: missing %s, unexpected %s"
                             % (missing[:5], unexpected[:5]))
        for name in net.order:
            value = net.to_cntk(name, arrays[name].astype(self.np.float32))
            target = net.params[name][0] if name in net.params else net.buffers[name]
            if tuple(target.shape) != tuple(value.shape):
                raise ValueError("%s: CNTK shape %s, weights give %s"
                                 % (name, tuple(target.shape), value.shape))
            target.value = value
        return {}

    def op_export_weights(self, request):
        net = self.net
        arrays = {}
        for name in net.order:
            source = net.params[name][0] if name in net.params else net.buffers[name]
            arrays[name] = net.to_canonical(name, self.np.array(source.value, self.np.float32))
        self.np.savez(request["path"], **arrays)
        return {}

    def arguments(self, images, labels):
        """Inputs as CNTK Values (copied once here, as a framework's input pipeline would)."""
        np = self.np
        classes = self.net.labels.shape[0]
        onehot = np.zeros((len(labels), classes), np.float32)
        onehot[np.arange(len(labels)), labels.astype(np.int64)] = 1.0
        return {self.net.features: self.C.Value(batch=np.ascontiguousarray(images, np.float32)),
                self.net.labels: self.C.Value(batch=onehot)}

    def op_set_batches(self, request):
        with self.np.load(request["path"]) as data:
            images, labels = data["images"], data["labels"]
        self.batches = [self.arguments(images[i], labels[i]) for i in range(len(images))]
        self.batch_size = int(images.shape[1])
        self.position = 0
        return {"batches": len(self.batches)}

    def next_batch(self):
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch

    def op_step(self, request):
        for _ in range(int(request.get("n", 1))):
            self.trainer.train_minibatch(self.next_batch())
        self.last_loss = None  # read lazily from the trainer
        return None  # no reply body: the client counts replies

    def op_loss(self, request):
        if self.last_loss is None:
            self.last_loss = float(self.trainer.previous_minibatch_loss_average)
        return {"loss": self.last_loss}

    def forward_backward(self, arguments):
        """Forward in training mode (keeping what backward needs), then backward from a root
        gradient of 1 per sample (the summed loss, as Trainer.train_minibatch does)."""
        loss = self.net.loss
        state, outputs = loss.forward(arguments, outputs=[loss.output],
                                      keep_for_backward=set([loss.output]))
        values = outputs[loss.output]
        root = self.np.ones_like(values)
        grads = loss.backward(state, {loss.output: root}, variables=set(self.params))
        return float(self.np.sum(values)), len(values), grads

    def op_profile(self, request):
        """One iteration with its phases timed apart (CNTK computes synchronously on the CPU,
        so no device sync is needed). The fast path (Trainer.train_minibatch) does the same
        work in one call; here forward is Function.forward (training mode, keeping what
        backward needs), backward is Function.backward from a root gradient of 1 per sample
        (the summed loss, as the Trainer does), gradients staying CNTK NDArrayViews, and the
        update is the momentum-SGD learner's own update. With several workers CNTK's
        data-parallel learner all-reduces the gradients (Communicator.aggregate_in_place, the
        call it makes itself) and then runs the same local update with the summed sample
        count; here the two are called one after the other to time them apart. What is
        approximate: the small extra all-reduce of the sample count and loss that the
        distributed learner adds is left out (the count is known: every worker has the same
        batch). CNTK sends nothing while backward runs, so with `overlapped` the
        communication is counted into backward_comm after backward, as it runs."""
        perf = time.perf_counter
        start = perf()
        arguments = self.next_batch()
        t_io = perf()
        t_h2d = perf()  # inputs are host-resident CNTK Values already
        loss = self.net.loss
        state, outputs = loss.forward(arguments, outputs=[loss.output],
                                      keep_for_backward=set([loss.output]))
        t_forward = perf()
        values = outputs[loss.output]
        grads = loss.backward(state, {loss.output: self.np.ones_like(values)},
                              variables=set(self.params), as_numpy=False)
        # the Python NDArrayView wrappers backward returns are not what the C++ calls take;
        # .data gives the underlying views (no copy)
        grads = dict((param, view.data) for param, view in grads.items())
        t_backward = perf()
        count = len(values)
        if self.communicator is not None:  # in the same order on every rank
            self.communicator.aggregate_in_place([grads[p] for p in self.params],
                                                 self.communicator.workers())
            count *= self.communicator.num_workers()
        t_comm = perf()
        self.local_learner._update(grads, count, False)
        t_update = perf()
        self.last_loss = float(self.np.mean(values))
        phases = {"io": t_io - start, "h2d": t_h2d - t_io, "forward": t_forward - t_h2d,
                  "update": t_update - t_comm}
        if request.get("overlapped"):
            phases["backward_comm"] = t_comm - t_forward
        else:
            phases["backward"] = t_backward - t_forward
            phases["comm"] = t_comm - t_backward
        return {"phases": phases}

    def op_gradients(self, request):
        with self.np.load(request["path"]) as data:
            images, labels = data["images"], data["labels"]
        total, count, grads = self.forward_backward(self.arguments(images, labels))
        net = self.net
        arrays = {}
        for param, value in grads.items():
            name = param.name
            arrays[name] = net.to_canonical(name, self.np.asarray(value, self.np.float32) / count)
        self.np.savez(request["out"], **arrays)
        return {"loss": total / count}

    def all_reduce(self, views):
        self.communicator.aggregate_in_place(views, self.communicator.workers())

    def op_barrier(self, request):
        # CNTK's Communicator.barrier() only waits for this rank's pending requests
        # (MPICommunicatorImpl::Barrier is a WaitAll): a one-number all-reduce synchronises.
        if self.communicator is not None:
            self.all_reduce([self.C.NDArrayView.from_dense(self.np.zeros(1, self.np.float32))])
        return {}

    def op_collective(self, request):
        """Seconds of CNTK's gradient all-reduce (Communicator.aggregate_in_place, one MPI
        all-reduce per array) on one float32 array per size, each timed call after a barrier."""
        if self.communicator is None:
            raise ValueError("one worker has nothing to all-reduce")
        times = {}
        for nbytes in request["sizes"]:
            view = self.C.NDArrayView.from_dense(
                self.np.zeros(max(1, int(nbytes) // 4), self.np.float32))
            for _ in range(int(request.get("warmup", 2))):
                self.all_reduce([view])
            measured = []
            for _ in range(int(request["repeats"])):
                self.op_barrier(request)
                start = time.perf_counter()
                self.all_reduce([view])
                measured.append(time.perf_counter() - start)
            times[str(int(nbytes))] = measured
        return {"times": times}

    def op_noop(self, request):
        return {}

    def op_close(self, request):
        return {}


def main():
    shim, setup_error = "", None
    try:
        shim = ensure_mpi_shim() or ""
    except Unavailable as error:
        setup_error = ("unavailable", str(error))
    # The protocol's own channel; anything else printed on fd 1 (CNTK's banners) goes to stderr.
    channel = os.fdopen(os.dup(1), "w", 1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    backend = Backend(shim)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request.get("op")
        try:
            if setup_error is not None:
                raise Unavailable(setup_error[1])
            handler = getattr(backend, "op_" + str(op), None)
            if handler is None:
                raise ValueError("unknown request %r" % op)
            try:
                reply = handler(request)
            except ImportError as error:
                raise Unavailable("cannot import CNTK in %s: %s" % (sys.executable, error))
            reply = dict(reply or {})
            reply["ok"] = True
        except Unavailable as error:
            reply = {"ok": False, "kind": "unavailable", "error": str(error)}
        except Exception as error:  # noqa: BLE001 - the client raises it with this line
            traceback.print_exc()
            reply = {"ok": False, "kind": "error",
                     "error": "%s: %s" % (type(error).__name__, error)}
        channel.write(json.dumps(reply) + "\n")
        if op == "close":
            break
    channel.flush()
    if backend.communicator is not None:
        backend.C.train.distributed.Communicator.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
