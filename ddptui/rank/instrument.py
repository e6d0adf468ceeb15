"""Zero-code instrumentation: per-rank steps and their phases from torch's own hook points.

Installed by the rank entry in every rank, under either launcher, before the target runs
(not with ``DDPTUI_NO_INSTRUMENT=1``, which ``--no-instrument`` sets, nor without a telemetry
endpoint). The script needs no ``import ddptui``. Nothing touches torch until the script
imports it: when torch is not loaded yet, a ``sys.meta_path`` finder waits for its import and
attaches the hooks once ``torch/__init__`` has run.

What is hooked (all removable, all cheap, none changes a result):

* ``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``_post_hook``: a step is one
  optimizer step; its end is the step boundary.
* Forward pre/post hooks on every ``DistributedDataParallel`` instance and on its inner
  module (registered by a wrapper around ``DistributedDataParallel.__init__``, so no other
  module pays for them; a *global* module hook would put every submodule call of every model
  on torch's slow call path). Only training forwards count (grad enabled, and the DDP module or
  the module it wraps in training mode).
  Once the inner module's post hook has closed one of a DDP module's training forwards, that
  DDP module's own post hook is removed (it is only a fallback), so a step costs seven hook
  calls: DDP forward pre, inner pre and post, one gradient hook, ``backward`` (call and
  return, one wrapper), optimizer pre and post.
* ``Tensor.register_post_accumulate_grad_hook`` on the DDP module's parameters, registered at
  its first training forward. After a few steps only the parameter whose gradient arrives
  last keeps its hook (re-armed when it stops firing), so a step costs one call.
* ``Tensor.backward`` is wrapped: the tensor it is called on is the loss (a 0-dim one), and
  its return marks the end of DDP's wait for the gradient all-reduce. ``GradScaler.scale`` is
  wrapped to report the unscaled loss, and ``GradScaler.step`` to end the step whose
  optimizer step it skipped (inf or NaN gradients); ``DistributedSampler.set_epoch`` to learn
  the epoch.
* ``DistributedSampler.__iter__`` (once per pass over the data, not per step): a shuffling
  sampler never told its epoch (``set_epoch``) that starts another training pass (grad
  enabled: an evaluation loop under ``no_grad`` is left alone) at the same epoch as its
  previous one shuffles every epoch in the same order. The rank says so once, as a
  ``note`` event; ddptui words it. A sampler told its epoch even once is never judged (a
  script that peeks at a batch, ``next(iter(loader))``, after ``set_epoch`` passes twice at
  one epoch, rightly).

``torch.compile`` (its tracer, dynamo) is told to leave ddptui's code alone, once
``torch._dynamo`` is imported (``trace_rules.add("ddptui")``, a second import watcher when it
is not loaded yet: importing it costs a second of CPU that a script without an optimizer or
``torch.compile`` never pays). Compiling a DDP module, ``torch.compile(DDP(model))`` as
torch's DDP notes advise, otherwise traced the hooks above into the user's compiled code:
each broke the graph at its clock read, and guards on the instrument's state (a float
timestamp) recompiled ``_forward_start`` on the next two steps (78–166 ms each in a small
2-rank CPU run whose steps take 2–5 ms). Skipped, a hook is a plain call between two
compiled parts, run as in eager mode; eager code pays nothing for it.

A copy of the DDP module (``copy.deepcopy``: an EMA model, a teacher) or the module pickled
whole carries no hook of ddptui's (see ``_ModuleHook``); ``torch.jit.script`` runs with the
hooks lifted off (it compiles a module's hooks with it), and a forward run while
``torch.jit.trace`` records is no step's and no evaluation's.

Phases of one step (the built-in ones partition the step exactly; ``constants.PHASES``):

* ``data``: from the end of the previous optimizer step to the next DDP forward (waiting for
  the next batch, plus anything the script does there: logging, ``zero_grad``). Between the
  micro-batches of gradient accumulation too.
* ``forward``: the inner module's forward.
* ``backward``: end of the forward to the last gradient accumulated: the rank's own backward
  compute, *including* the loss and any user compute between forward and ``backward()``.
* ``comm``: waiting for communication: the last gradient accumulated to ``backward()``'s
  return, where DDP waits for the all-reduce of its last buckets (to the optimizer step when
  ``backward()`` was not seen); also DDP's work before the forward (buffer broadcast, bucket
  rebuild, input copies with ``device_ids``).
* ``other``: ``backward()``'s return to the optimizer step (gradient clipping, unscaling),
  and a second optimizer's time in the same iteration.
* ``optimizer``: ``optimizer.step()``.
* ``optimizer.step(closure)`` (PyTorch Lightning's loop, LBFGS) runs the forward and backward
  inside the optimizer step: a forward that starts there makes the step a closure step, whose
  time from ``optimizer.step``'s call to the forward is ``data`` (and, once a step was one,
  the next step's time before that call too), and whose time from ``backward()``'s return
  to the step's end is ``optimizer``. A closure evaluated again in the same step (LBFGS's
  line search) counts its batch and its loss once (the first evaluation's, which ``step``
  returns); the time between evaluations is ``optimizer``.
* custom phases, ``with ddptui.phase("name"):``, measured on the host and reported *beside*
  the built-in ones: they overlap them (a custom phase inside the data wait counts in both).

Exactness. On CPU every phase is host time (``time.perf_counter``) between hook calls: exact
up to the hooks' own cost (about a microsecond each). Step time is the interval between
optimizer steps; an iteration that steps several optimizers on one batch (a GAN: DCGAN's
``optimizerD.step()`` then ``optimizerG.step()``) is one step, which the first ends, where
the script draws its batches from a DataLoader (see ``_joins``); the others' time is the next
step's. The loss is the mean of the 0-dim tensors ``backward()`` (or
``torch.autograd.backward``) was called on in the step; when each
was divided by their number (gradient accumulation written ``loss = loss /
accumulation_steps``: the quotient's autograd node, ``DivBackward0``, holds that number on the
host), the mean before the division, which is the loss the script has; the sum of the
micro-batches' losses where they went through the HF Trainer's ``training_step`` (which
divides them so that they add up, and logs their sum), or where they all came of one batch
drawn from a DataLoader (the terms of one objective: DCGAN's ``errD_real + errD_fake``). A
further optimizer's losses in the same iteration (the generator's) are not the step's.
The epoch is the last ``DistributedSampler.set_epoch`` value, as the script numbers it;
without one, an HF accelerate loader's pass, or the training passes over a DataLoader from 0
(see ``_loader_pass``); else None. Samples per step: dim 0 of the first tensor argument of
each training DDP forward in the step, summed (gradient accumulation), but no more than the
batches drawn: dim 0 of the first tensor of each batch a ``DataLoader`` gave since the last
step with grad enabled, from the iterator that gave the last one, summed
(``_BaseDataLoaderIter.__next__`` is wrapped: one call per batch), so that a GAN's or a
contrastive script's several forwards of one batch count it once. Without a DDP module
(FSDP, a plain model): the batches drawn; 0 without a DataLoader.
Evaluation forwards (no grad, or eval mode) are not timed: their time falls in the next
step's ``data``.

On GPU (the DDP module's parameters on CUDA) the built-in phases are device time: a CUDA
event (timing enabled) is recorded on the current stream at each hook, and the phases are the
``elapsed_time`` between them, read once the events have completed (``Event.query()``): no
synchronisation and no ``.item()`` on the training path. So ``data`` is the time the GPU
idled (or copied input) between the optimizer step and the next forward; ``comm`` is the
gradient all-reduce the compute stream waited for; the phases sum to the step on the GPU's
timeline. The loss is copied to pinned host memory behind the same events. The step event is
sent once its events completed (usually a step or two later); step time and samples/s are
host time, taken at the optimizer step. The last-gradient event sits behind the last kernel of
the parameter learned to get its gradient last. Custom phases stay host time.

Explicit ``ddptui.log`` calls win: once a script calls it, the hooks stop sending steps (the
one just finished included) and attach the phases measured since the previous call to the
next explicit call instead (``phases=`` given explicitly wins over them).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import math
import os
import re
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from threading import get_ident
from typing import Any

import ddptui
from ddptui.constants import ENDPOINT_ENV, MAX_STEPS_PER_EVENT, NO_INSTRUMENT_ENV, PHASES
from ddptui.rank import heartbeat, spawned, trained
from ddptui.rank.drainer import Drainer

#: Steps with every gradient hook armed before keeping only the last parameter's.
LEARN_STEPS = 2
#: Times the last parameter may change before every hook stays armed for good.
MAX_RELEARN = 3
#: Training forwards of a DDP module whose frozen parameters are looked at again for thawed
#: ones (see _GradWatch.arm_thawed), until a hook fires: a module frozen for good costs a look
#: at each parameter no more than that many times an arming.
MAX_THAW_CHECKS = 64
#: Custom phase names kept per process (more are ignored, counted in ``phases_ignored``).
MAX_CUSTOM_PHASES = 8
#: Finished GPU steps whose events may still be on the device; beyond, the oldest is sent
#: without phases if the device has not passed them yet (with them if it has: fast steps
#: fill more than this in one drainer interval).
MAX_PENDING = 64
#: Finished steps whose values are on the host already (CPU training), waiting for the
#: drainer; beyond, the oldest goes without its loss and phases (a bound on what a starved
#: drainer leaves queued, far above what one interval holds: 0.4 ms CPU steps fill 125 in
#: one). At MAX_PENDING, 975 of 2,000 such steps of a small CPU model (one rank under
#: ddptui) went out without a loss.
MAX_PENDING_HOST = 4096
#: Loss tensors kept per step (gradient accumulation): at this many, the next one first folds
#: them into their sum (one stack and sum on their device, once per this many micro-batches),
#: so that every micro-batch's loss is in the step's mean and a GPU step copies at most this
#: many to the host. nanoGPT accumulates 40 a step on one GPU; its mean was of the first 8. Up
#: to this many the step's losses stay apart, so that parts and their totals can be told (see
#: :func:`_loss_mean`): torchtitan's chunked loss sends 9 a micro-batch, 18 with 2 of them.
MAX_LOSSES = 64
#: How a step's losses make its loss (see :func:`_loss_mean`): what each was divided by for
#: their accumulation (1, or their number), and the rank's loss factor.
LossScale = tuple[int, int]
#: Finished steps go to the reporter from the drainer thread at most this often, in one
#: message. Each drain and its send have a cost of their own besides each step's (cold
#: caches, the GIL taken from the training thread, ZeroMQ's I/O thread woken): at 50 ms
#: the other threads took 68 us of CPU a 10 ms step and the training thread waited 10 us a
#: step for the GIL; at 0.2 s, 24 and 1.8 us (bench_instrument.py, 150 pairs each). The
#: dashboard draws at 3 to 4.5 Hz: a step reaches it at most this much later.
SEND_INTERVAL_S = 0.2
#: Steps shorter than this that the drainer finds ready together go as one event of up to
#: MERGE_S of their time (``protocol.Step.steps`` says how many): a line of events.jsonl a
#: step a rank made 4 GB an hour of 0.4 ms steps and kept the dashboard busy; at most about
#: 40 events a second a rank now. Longer steps go one by one, as before.
MERGE_BELOW_S = 0.005
MERGE_S = 0.025

#: Most of a framework's other evaluation numbers (the HF Trainer's runtime, samples per
#: second and ``compute_metrics`` ones; Lightning's other logged numbers) carried with an
#: evaluation it reports.
HF_EXTRA_METRICS = 16

#: DistributedSamplers followed at once (their pass counts); more are not judged.
MAX_SAMPLERS = 256

#: ``torch.distributed`` functions a script may call itself, timed as ``comm``.
COLLECTIVES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
)
#: Point-to-point ops (``send`` and ``recv`` are timed as collectives too): a rank that calls
#: one communicates where its Flight Recorder's collective progress may not show it (gloo
#: records none), which it says once (the ``p2p`` note: a pipeline's stages train together).
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
_FALSE = ("", "0", "false", "no", "off")
_BWD = ("bwd", "after_bwd")  # segments that may hold gradients
#: Devices whose losses are read without a DDP module: the CPU's with ``.item()`` off the
#: step path, CUDA's through a pinned copy and an event (see :class:`LossRead`).
_LOSS_DEVICES = ("cpu", "cuda")
#: A step's phase accumulators before any time is added (copied: faster than building one).
_NO_PHASES = dict.fromkeys(PHASES, 0.0)


def warned_at_script(script: Any, call: Callable[[], Any]) -> Any:
    """``call()`` (a wrapped torch function), its warnings shown where the script called it.
    A warning torch points at its caller (``stacklevel=2``) would name this module's wrapper
    instead: under ddptui, timm's ``train.py`` logged ``ddptui/rank/instrument.py:763:
    FutureWarning: `broadcast_buffers` is deprecated`` where plain torchrun logged timm's own
    line. Caught as they come and issued again after the call at the script's frame
    (``script``), so that its warning filters, and Python's once per place, act on them as
    they would without ddptui; a warning pointing elsewhere keeps its place. For calls made
    once a run (a catch costs microseconds), not on the step path."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # the script's filters decide, below
            return call()
    finally:
        for warning in caught:
            if warning.filename == __file__:
                where = script.f_globals
                warnings.warn_explicit(
                    warning.message,
                    warning.category,
                    script.f_code.co_filename,
                    script.f_lineno,
                    module=where.get("__name__"),
                    registry=where.setdefault("__warningregistry__", {}),
                )
            else:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )


def wanted(environ: dict[str, str] | None = None) -> bool:
    """Whether this rank should be instrumented: it reports to ddptui and the user did not
    switch the hooks off."""
    env = os.environ if environ is None else environ
    if not env.get(ENDPOINT_ENV):
        return False
    return env.get(NO_INSTRUMENT_ENV, "").strip().lower() in _FALSE


_instrument: Instrument | None = None


def current() -> Instrument | None:
    """This process's instrumentation, if installed."""
    return _instrument


def ddp_possible() -> bool:
    """Whether this process may hold a DDP module, whose gradient all-reduce a ``backward()``
    waits in: one the hooks watch, or no hooks to say (``--no-instrument``, or turned off by
    an internal error). The heartbeat's source (set by the rank entry)."""
    inst = _instrument
    return inst is None or inst.disabled or inst.holds_ddp()


def install(environ: dict[str, str] | None = None, force: bool = False) -> Instrument | None:
    """Install the hooks (now if torch is loaded, else when the script imports it).

    Returns the :class:`Instrument`, or None when not :func:`wanted` (``force`` skips that
    check: tests and benchmarks). Idempotent.
    """
    global _instrument
    if _instrument is not None:
        return _instrument
    if not force and not wanted(environ):
        return None
    inst = Instrument()
    _instrument = inst
    ddptui._instrument = inst
    # The heartbeat asks it whether a backward() may wait for DDP's gradient all-reduce: in
    # the rank ddptui launched, and in a worker the script spawned, which installs the hooks
    # itself (without, a spawned worker with no DDP module read as waiting in one).
    heartbeat.set_ddp_source(ddp_possible)
    heartbeat.set_thread_source(_steps_thread)
    heartbeat.set_evaluations_source(evaluations)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "Tensor"):
        inst.attach(torch)
    else:
        sys.meta_path.insert(0, _TorchImportWatcher(inst.attach))
    return inst


def evaluations() -> int:
    """Evaluation batches this rank has run so far (:attr:`Instrument.evaluations`; 0
    without the hooks): the heartbeat's source."""
    inst = _instrument
    return inst.evaluations if inst is not None else 0


def _steps_thread() -> int | None:
    """The thread whose optimizer steps ended the last step (None before one)."""
    inst = _instrument
    return inst._step_thread if inst is not None else None


def uninstall() -> None:
    """Remove every hook and patch (tests, benchmarks)."""
    global _instrument
    inst, _instrument = _instrument, None
    ddptui._instrument = None
    for finder in [f for f in sys.meta_path if isinstance(f, _TorchImportWatcher)]:
        sys.meta_path.remove(finder)
    if inst is not None:
        inst.detach()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) has no drainer thread: a drain the parent's
    thread had under way leaves its lock held in the child, so the child gets a new one.
    Its stepping thread is the one that forked, known at its first step."""
    inst = _instrument
    if inst is not None:
        inst._send_lock = threading.RLock()
        inst._draining = None
        inst._step_thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


#: torch.compile's tracer: ddptui's code is put on its skip list once it is imported.
_DYNAMO = "torch._dynamo"
#: torchmetrics' base class: its accuracies computed after an evaluation are reported.
_TORCHMETRICS = "torchmetrics.metric"
#: PyTorch Ignite's engine: the metrics of an evaluator's run are reported.
_IGNITE = "ignite.engine.engine"
#: fastai's learner: the validation metrics its Recorder keeps are reported.
_FASTAI = "fastai.learner"
#: fastai's optimizers (loaded by its learner): their steps are the steps' optimizer phase.
_FASTAI_OPTIMIZER = "fastai.optimizer"
#: No such attribute (where None is a value).
_ABSENT = object()
#: SpeechBrain's ``Brain``: the validation loss its ``fit`` computes each epoch is reported.
_SPEECHBRAIN = "speechbrain.core"
#: The modules of TensorBoard's ``SummaryWriter``: torch's and tensorboardX's.
_TENSORBOARD = ("torch.utils.tensorboard.writer", "tensorboardX.writer")
#: Weights & Biases' run: the evaluations a script logs through ``wandb.log`` are reported.
_WANDB = "wandb.sdk.wandb_run"
#: FSDP2's package: ``fully_shard`` says the mesh a model's gradients are synchronized over.
_FSDP = "torch.distributed.fsdp"
#: Tensor parallelism's package: ``parallelize_module`` says the ranks that share batches.
_TENSOR_PARALLEL = "torch.distributed.tensor.parallel"
#: MMEngine's runners (OpenMMLab's training loop: mmpretrain, mmdet, mmseg...) by module.
_MMENGINE = {
    "mmengine.runner.runner": "Runner",
    "mmengine.runner._flexible_runner": "FlexibleRunner",
}
_MMENGINE_LOOPS = "mmengine.runner.loops"
#: Most of an MMEngine validation's metrics looked at.
MAX_MMENGINE_METRICS = 64
#: ``_framework_eval``'s epoch when none is given: the one training is in.
_NOW = object()
#: Most datasets of ignite engines that trained remembered (see Instrument._ignite_ran).
MAX_IGNITE_TRAINED = 64
#: How far down an evaluator's data is followed to the datasets it reads (its loader's
#: dataset, a Subset's, ...) to find a trainer's dataset.
MAX_DATA_DEPTH = 4
#: Most epochs a framework's plan announces (``--epochs`` takes as many).
MAX_PLANNED_EPOCHS = 1_000_000
#: Most outputs of a step's training forwards kept to tell a DDP module fed another's.
MAX_STEP_OUTPUTS = 8
#: A training pass that waits this long for its DataLoader's workers to start again, and
#: :data:`LOADER_RESTART_SHARE` of the pass before it, is noted (``loader_restart``).
LOADER_RESTART_S = 5.0
LOADER_RESTART_SHARE = 0.1
#: Most steps a ``loader_steps`` note says (protocol.MAX_NOTE_NUMBER, without loading it).
MAX_LOADER_STEPS = 1_000_000_000
#: Most samples a batch object's own ``batch_size`` is believed for (PyTorch Geometric's).
MAX_TOLD_BATCH = 1_000_000_000


class _TorchImportWatcher:
    """A ``sys.meta_path`` finder that only waits for one import (``import torch``, or
    ``name``): it lets the normal finders find the module, and calls ``on_loaded(module)``
    right after its ``__init__`` ran. Every other import costs one string comparison."""

    def __init__(self, on_loaded: Callable[[Any], None], name: str = "torch") -> None:
        self.on_loaded = on_loaded
        self.name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _NotifyingLoader(spec.loader, self.on_loaded)
        return spec


class _NotifyingLoader:
    """Wraps torch's loader for one import; puts the real loader back once it has run."""

    def __init__(self, loader: Any, on_loaded: Callable[[Any], None]) -> None:
        self._loader = loader
        self._on_loaded = on_loaded

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            self._loader.exec_module(module)
        finally:
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        self._on_loaded(module)


# -- custom phases ------------------------------------------------------------------------------
class _Phase:
    """``with ddptui.phase(name):`` under instrumentation: host time added to the step."""

    __slots__ = ("_inst", "_name", "_t0")

    def __init__(self, inst: Instrument, name: str) -> None:
        self._inst = inst
        self._name = name
        self._t0 = 0.0

    def __enter__(self) -> _Phase:
        self._t0 = self._inst.clock()
        return self

    def __exit__(self, *exc: object) -> bool:
        self._inst.add_custom(self._name, self._inst.clock() - self._t0)
        return False


# -- GPU timings ---------------------------------------------------------------------------------
class CudaStepRead:
    """One step's CUDA events (and loss copies), read once the device has passed them.

    Follows the ``query()`` / ``values()`` / ``keys()`` shape of the reporter's pending reads
    (``ddptui.rank.pending.Read``), so it can ride in the reporter's own pending queue: ``values()``
    gives ``("phases", {...})`` and ``("loss", float | None)``.
    """

    __slots__ = ("_marks", "_losses", "_custom", "_scale", "_count")

    def __init__(
        self,
        marks: list[tuple[str, Any]],
        losses: list[Any],
        custom: dict,
        scale: LossScale,
        count: int,
    ) -> None:
        self._marks = marks  # [("start", ev0), (phase, ev1), ...]: phase = ev(i-1) -> ev(i)
        self._losses = losses  # pinned host copies (or floats already read)
        self._custom = custom
        self._scale = scale  # accumulation and loss factor (see _finish_step)
        self._count = count  # the losses they hold (a folded sum holds several)

    def query(self) -> bool:
        return all(event.query() for _, event in self._marks)

    def values(self) -> list[tuple[str, Any]]:
        phases = dict.fromkeys(PHASES, 0.0)
        previous = self._marks[0][1]
        for name, event in self._marks[1:]:
            phases[name] += max(0.0, previous.elapsed_time(event) / 1000.0)
            previous = event
        phases.update(self._custom)
        loss = _host_loss(self._losses, self._scale, self._count)
        return [("phases", phases), ("loss", loss)]

    def keys(self) -> list[str]:
        return ["phases", "loss"]


class LossRead:
    """A step's loss copies from a GPU, in a script without a DDP module (so no device phases):
    read once the device has passed ``event``, the same ``query()`` / ``values()`` / ``keys()``
    shape as :class:`CudaStepRead`."""

    __slots__ = ("_event", "_losses", "_phases", "_scale", "_count")

    def __init__(
        self,
        event: Any,
        losses: list[Any],
        phases: dict[str, float] | None,
        scale: LossScale,
        count: int,
    ) -> None:
        self._event = event
        self._losses = losses  # pinned host copies (or floats already read)
        self._phases = phases  # the script's own phases, if any
        self._scale = scale
        self._count = count

    def query(self) -> bool:
        return bool(self._event.query())

    def values(self) -> list[tuple[str, Any]]:
        loss = _host_loss(self._losses, self._scale, self._count)
        return [("phases", self._phases), ("loss", loss)]

    def keys(self) -> list[str]:
        return ["phases", "loss"]


# -- module hooks ------------------------------------------------------------------------------
def _recording(torch: Any) -> Callable[[], bool]:
    """Whether torch records a trace of the model now: TorchScript's tracer
    (``torch.jit.trace``, the TorchScript ONNX exporter) or ``torch.export`` (its forward in
    training mode counted the export's batch into the next step's samples)."""
    tracing = getattr(torch._C, "_is_tracing", None)
    exporting = getattr(getattr(torch, "compiler", None), "is_exporting", None)
    if tracing is None or exporting is None:
        return tracing or exporting or (lambda: False)

    def recording() -> bool:
        return tracing() or exporting()

    return recording


#: What a copy of a watched module holds where ddptui's hook was: a call that does nothing
#: (an audit event no one listens to, unless an audit hook is installed) and that pickles as
#: Python's own ``sys.audit``, so that a module saved whole loads where ddptui is not installed.
UNWATCHED_EVENT = "ddptui.unwatched"
_UNWATCHED = functools.partial(sys.audit, UNWATCHED_EVENT)


class _ModuleHook(functools.partial):
    """One of ddptui's hooks on a module, called as the method it holds (``functools.partial``
    calls it from C: no frame of its own on the step path).

    torch copies a module's hooks with it. A copy of a watched module (``copy.deepcopy``:
    ``AveragedModel``'s EMA model, a teacher) is not the DDP module's and must not be
    watched, and copying the hook copied the instrument with it (torchvision's reference
    died with ``cannot pickle 'module' object`` making its EMA model after the DDP wrap). A
    module pickled whole (``torch.save(model.module)``) must load without ddptui. Both get
    :data:`_UNWATCHED` in the hook's place."""

    __slots__ = ()

    def __deepcopy__(self, memo: dict) -> Any:
        return _UNWATCHED

    def __reduce__(self) -> Any:
        return _UNWATCHED.__reduce__()


# -- gradient hooks ----------------------------------------------------------------------------
class _GradWatch:
    """Post-accumulate-grad hooks on one DDP module's parameters. Learns which parameter
    gets its gradient last and then keeps only that one's hook.

    torch refuses a hook on a parameter that does not require a gradient, and a script may
    freeze and thaw its modules as it goes: StyleGAN's loop thaws each network only for its
    own phases (``requires_grad_(True)`` before, ``(False)`` after), and runs the other one
    frozen. A parameter frozen when its hooks are armed gets none (it can get no gradient
    then); until a hook has fired, each training forward of the module arms the ones thawed
    since (:meth:`arm_thawed`). Pruning keeps the hook already on the last parameter rather
    than registering another (it may be frozen by the step's end). A refused hook turned
    all of ddptui's step instrumentation off in NVlabs/stylegan2-ada-pytorch: 1 step of 32."""

    def __init__(self, inst: Instrument, params: list[Any]) -> None:
        self.inst = inst
        self.params = params
        self.handles: dict[int, Any] = {}  # by the parameter's index
        #: Some parameter was frozen when the hooks were armed, and none has fired since.
        self.thawing = False
        self.thaw_checks = 0
        self.learned: list[int] = []
        self.kept: int | None = None
        self.relearns = 0
        self.last: int | None = None
        self.fired = 0
        self.arm_all()

    def _hook(self, index: int) -> Callable[[Any], None]:
        # One flat function: it runs inside the autograd engine, after the step's backward
        # kernels have pushed the interpreter's data out of the CPU caches, where every call
        # and attribute costs many times what it costs warm.
        inst = self.inst

        def hook(param: Any) -> None:
            inst.hook_calls += 1
            if inst.disabled:
                return
            self.last = index
            self.fired += 1
            if inst._seg in _BWD:
                inst._t_grad = inst.clock()
                if inst._cuda is not None:
                    inst._record_grad_event()

        return hook

    def remove(self) -> None:
        for handle in self.handles.values():
            handle.remove()
        self.handles = {}

    def release(self) -> None:
        """Its DDP module is gone: let go of the parameters (the script may have let go of
        them too: a model trained after another, a fold after a fold, whose memory, a GPU's,
        the watch kept). The hooks stay on those the script still holds (removed here, from a
        weak reference's callback that the collector may run in the middle of autograd's
        calls to them, they could break its loop over them); they no longer count."""
        self.params = []
        self.last = None

    def arm_all(self) -> None:
        self.remove()
        self.kept = None
        self.learned = []
        self.thawing = False
        self.thaw_checks = 0
        self.arm_thawed()

    def arm_thawed(self) -> None:
        """Hooks on the parameters that require a gradient now and have none yet."""
        self.thaw_checks += 1
        handles, frozen = self.handles, False
        for index, param in enumerate(self.params):
            if index in handles:
                continue
            if getattr(param, "requires_grad", False):
                handles[index] = param.register_post_accumulate_grad_hook(self._hook(index))
            else:
                frozen = True
        self.thawing = frozen and not self.fired and self.thaw_checks < MAX_THAW_CHECKS

    def end_step(self) -> None:
        """After a training step: learn, prune, or re-arm when the kept hook went quiet."""
        last, fired = self.last, self.fired
        self.last, self.fired = None, 0
        if self.kept is not None:
            if fired == 0:
                self.relearns += 1
                self.arm_all()
            return
        if last is None:
            return
        self.thawing = False
        self.learned.append(last)
        if len(self.learned) >= LEARN_STEPS and self.relearns < MAX_RELEARN:
            if len(set(self.learned[-LEARN_STEPS:])) == 1:
                kept = self.handles.pop(last, None)
                self.remove()
                if kept is None:  # re-armed since it fired (cannot be): learn again
                    self.arm_all()
                    return
                self.handles = {last: kept}
                self.kept = last


# -- the instrumentation -----------------------------------------------------------------------
class Instrument:
    """The hooks' state for this process: the current step's phases, and what to send."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.torch: Any = None
        self._grad_enabled: Callable[[], bool] = lambda: True  # torch.is_grad_enabled once attached
        #: Whether a trace of the model is being recorded (``torch.jit.trace``, the ONNX
        #: exporters, ``torch.export``): the forwards it runs are no step's or evaluation's.
        self._tracing: Callable[[], bool] = lambda: False
        #: The DDP modules watched (weakly): a batch drawn while every one is in eval mode is
        #: an evaluation's, with grad enabled or not.
        self._models: list[weakref.ref] = []
        self.disabled = False
        self.explicit = False
        self.hook_calls = 0
        self.phases_ignored = 0
        self.steps_sent = 0
        self._undo: list[Callable[[], None]] = []
        self._handles: list[Any] = []  # forward hooks on DDP modules and their inner modules
        # DDP's forward post hooks while still needed (by id of the DDP module): once its
        # inner module's post hook has closed a training forward, the DDP one goes
        self._outer_posts: dict[int, Any] = {}
        self._outer_pres: dict[int, Any] = {}  # and their pre hooks
        #: id of a watched DDP module's inner module -> (a weak reference to) the DDP module.
        self._inner_owner: dict[int, Any] = {}
        #: The DDP modules whose forward the script calls itself, ``model.forward(x, y)`` (see
        #: :meth:`_check_direct`): timed by ddptui's ``DistributedDataParallel.forward``.
        self._direct: Any = weakref.WeakSet()
        self._direct_checked: set[int] = set()  # inner modules :meth:`_check_direct` saw
        self._ddp_forward: Any = None  # DistributedDataParallel.forward, as torch has it
        self._fwd_ddp: int | None = None  # the DDP module whose training forward runs
        self._watches: dict[int, _GradWatch] = {}
        #: (id, its inner module's id) of watched DDP modules gone since the last watch():
        #: what is kept by those ids goes before a new module may be given one of them.
        self._gone: list[tuple[int, int]] = []
        self._cuda: Any = None  # torch.device of the DDP module when it lives on CUDA
        # the step in progress
        self._seg = "data"
        self._mark: float | None = None
        self._acc = dict.fromkeys(PHASES, 0.0)
        self._custom: dict[str, float] = {}
        self._step_start: float | None = None
        #: When the first training batch came out of a DataLoader, before any step or DDP
        #: forward: where the first step starts when no forward is seen (see _opt_pre).
        self._first_draw: float | None = None
        #: When a DataLoader's iterator was last asked for (``iter(loader)``, its workers
        #: started in it): where an epoch's first step starts (see _between_passes).
        self._iter_at: float | None = None
        self._pass_began: float | None = None  # the training pass's first batch came then
        self._restart_noted = False  # see _check_restart
        self._iter_event: Any = None  # on a GPU, a CUDA event recorded then
        self._fwd_seen = False
        self._ddp_seen = False
        self._samples = 0  # the most samples one module's forwards took (_add_samples)
        self._module_samples: dict[int | None, int] = {}
        #: The tensors the step's training forwards of DDP modules returned (weak), so far.
        self._outputs: list[weakref.ref] = []
        # Without DDP (FSDP, a plain model, a script that wraps only on GPU) no forward is
        # seen: samples are the batches a DataLoader gave (with grad enabled) since the last
        # step instead, from the iterator that gave the last one (an evaluation loader's
        # batches in between are not the step's). The iterator is known by the id of its
        # dataset only (a reference would keep its worker processes alive): a new pass over
        # the same data is the same loader's, whose batch drawn ahead in the last pass (by
        # accelerate's prefetching shard) a step of this pass takes.
        self._loader_data = 0
        self._loader_samples = 0
        #: Neither (no DDP module, no DataLoader: karpathy/nanochat's token generator and
        #: optimizer that syncs the gradients): the training forwards of the module the first
        #: step's optimizer trains (``trained.trained_root``, looked for once), counted by a
        #: pre-hook of its own from the second step on (looked for again once that optimizer
        #: is gone: see _joins), each module watched once.
        self._plain_looked = False
        self._plain_roots: Any = weakref.WeakSet()
        self._plain_samples = 0
        self._data_parallel_said: int | None = None  # the least said (see _data_parallel)
        #: What each loss is multiplied by as it is reported: the ranks FSDP sums this rank's
        #: gradients over (see _summed_gradients), else 1.
        self._loss_factor = 1
        #: ``backward()`` calls since the last step ended (see _making_state).
        self._backwards = 0
        #: Inside an optimizer step that only makes its state (see _makes_state): its depth.
        self._making_state = 0
        #: With DDP, samples that iterator gave before this step and no step took: a batch
        #: drawn ahead of its step (timm's prefetcher) is the next step's (see _finish_step).
        self._drawn_ahead = 0
        #: Seconds this step waited in a DataLoader for its training batches (None: it drew
        #: none): its ``data``, the rest of what came before its forward being ``other``.
        self._step_wait: float | None = None
        self._losses: list[Any] = []
        self._t_grad: float | None = None
        self._grad_event: Any = None
        self._active: set[int] = set()  # grad watches used in this step
        self._training_fwd = False  # inside a training forward (of DDP, or its inner module)
        #: DDP modules (their ids) that train in eval mode: a backward followed a forward of
        #: theirs made in eval mode with grad on (a linear probe on a frozen backbone, whose
        #: BatchNorm must keep its statistics: facebookresearch/moco's ``main_lincls.py``
        #: calls ``model.eval()`` before its training loop).
        self._eval_trainers: set[int] = set()
        #: The last forward of a DDP module in eval mode with grad on, until a backward says
        #: whether it trained: (its id, its watch, the watch's firings before, its batch's
        #: samples, whether it began the evaluation span).
        self._eval_grad: tuple[int, Any, int, int, bool] | None = None
        #: The last batch drawn while grad was on but every DDP module in eval mode:
        #: (iterator, samples, wait began, ended): a training batch if a backward shows that
        #: module trains in eval mode.
        self._mode_draw: tuple[weakref.ref, int, float, float] | None = None
        # (the scaled loss, weakly; the unscaled loss, the number it was divided by, if any)
        self._scaled: tuple[weakref.ref, Any, float | str | None] | None = None
        # The step's losses: how many backward() calls had one (the list keeps MAX_LOSSES),
        # and what each recorded one was divided by (None: not a division by a CPU number;
        # WINDOW: a mean over the accumulation window, see _divisor; UNREAD: not read).
        self._loss_count = 0
        self._loss_divisors: list[float | str | None] = []  # each value once (see _keep_loss)
        # Whether a step of this run had more than one loss (gradient accumulation, or terms
        # of one objective): until one has, a step's first loss's divisor is not read (its
        # graph costs 5.5 us of a 3 ms SmallCNN step to read, and one loss needs none).
        self._several_losses = False
        # How many losses the folded first entry of ``_losses`` holds beyond one (their sum).
        self._folded = 0
        # The step's micro-batches went through the HF Trainer's ``training_step``: their
        # losses add up to the step's loss, however they were divided (see _attach_transformers).
        self._summed_losses = False
        # Optimizer steps under way, one inside another: torch hooks the ``step`` of every
        # optimizer class it has made an instance of, so a subclass whose ``step`` calls
        # ``super().step()`` (or ZeroRedundancyOptimizer, whose step runs its inner
        # optimizer's) fires the global hooks twice once its base class has an instance too.
        # Only the outermost step counts; a forward or ``backward()`` resets the count, so a
        # step that raised between its hooks does not swallow the next one.
        self._opt_depth = 0
        # ``optimizer.step(closure)`` (PyTorch Lightning's loop, LBFGS): the forward and
        # backward run inside the optimizer step. ``_closure_now``: this step's forward began
        # inside it; ``_closure_loop``: the last step's did, so the time before this step's
        # ``optimizer.step`` call is the data wait, not the "other" it is in a plain loop.
        self._closure_now = False
        self._closure_loop = False
        self._closure_repeat = False  # a repeated evaluation of this step's closure runs
        # A spawned worker whose rank is not known yet (see spawned.learn_rank).
        self._rank_unknown = not spawned.learn_rank()
        self._epoch: int | None = None
        # A DistributedSampler was told an epoch (``set_epoch``): the script's own numbering.
        self._epoch_told = False
        # The sampler whose epoch that is (weakly), and its size: of several told theirs, the
        # one over the most samples (see _told_epoch).
        self._epoch_sampler: Any = None
        self._epoch_size = 0
        self._epoch_tells = 0  # the epochs so told, ever (see _untrained_pass)
        # Without a DistributedSampler told its epoch or an accelerate loader, the epoch is
        # the training passes over a DataLoader (see _loader_pass): the passes counted (-1:
        # none yet), and the batches the current one gave and whether it ran to its end.
        self._passes = -1
        # The iterator of the current pass, weakly: an id would be a dead iterator's for the
        # next object CPython puts at its address (an evaluation's iterator made after a
        # step's ``next(iter(loader))``, whose pass end then read as the training pass's).
        self._pass_it: weakref.ref | None = None
        #: Batches in the first training pass over a DataLoader (0: it has no length), read
        #: once: with the batches a step draws, an epoch's length (_finish_step), sent with
        #: the steps (_deliver) while they are the hooks' own (see explicit_log).
        self._pass_length: int | None = None
        #: The batches a training epoch takes where a framework says so, when fewer than its
        #: DataLoader's (Lightning's ``limit_train_batches``): the pass's length is no more.
        self._pass_limit = 0
        #: That pass's iterator (until the second step ends) and the batches drawn from it
        #: in the step under way: a step that also draws from another loader (a second
        #: dataset zipped with the first) makes one step of that pass, not two.
        self._length_it: weakref.ref | None = None  # (weakly, as _pass_it)
        self._length_draws = 0
        self._loader_steps = 0  # to send
        self._loader_steps_sent = False
        self._pass_batches = 0
        self._pass_ended = False
        #: A training pass begun since the last step: its iterator (weak), the backwards and
        #: forwards counted when it began, when it did and what its first batch changed (see
        #: _untrained_pass), until another loader's draw or a step's end.
        self._suspect: tuple[weakref.ref, int, int, float, dict[str, Any]] | None = None
        # backward() calls and forwards (with grad or without) ever: never reset, unlike
        # _backwards, which a joined optimizer's losses forget in the middle of a pass
        self._grad_calls = 0
        self._fwd_calls = 0
        #: Evaluation batches ever: forwards of a DDP module (or of a plain model watched)
        #: with grad off or in eval mode that are no step's own, and batches drawn from a
        #: DataLoader for them. Read by the heartbeat (see :func:`evaluations`): where it
        #: grew between two beats and no step ended, the rank evaluates (ddptui shows
        #: ``evaluating``, not ``preparing`` nor a bare rate). Only evaluation paths count
        #: it: nothing on a training step's path.
        self.evaluations = 0
        # One iteration, several optimizers (a GAN's discriminator and generator, DCGAN's
        # ``optimizerD.step()`` then ``optimizerG.step()`` on one batch): training batches
        # drawn from a DataLoader since the last step ended, whether that step drew any, the
        # optimizer that ended it, and the other optimizers that stepped since without a new
        # batch (see _joins). Whether the last two steps each drew from the same dataset, and
        # whether another optimizer joined a step yet: a script whose iterations step several
        # optimizers on a batch drawn for each, where one of them may step twice on it.
        self._draws = 0
        self._step_drew = False
        self._step_ender = 0
        #: That optimizer, weakly: once it is gone, the next optimizer is no other optimizer
        #: of that step's iteration (see _joins).
        self._ender_ref: weakref.ref | None = None
        self._joined: set[int] = set()
        self._drew_from = 0  # the dataset the last step drew from (0: it drew none)
        self._steady_draws = False
        self._several_optimizers = False
        self._marks: list[tuple[str, Any]] = []  # GPU: this step's (phase, event)
        # Steps finished, waiting to be sent, and phases held for explicit logs. Each is
        # (epoch, samples, step time, read, monotonic and wall time of its end): read is
        # (phases, loss) when known at the step's end (CPU), else a CudaStepRead. The
        # training thread only appends; the drainer thread (or a flush) takes them in order
        # under ``_send_lock``.
        self._pending: deque[tuple[int | None, int, float, Any, float, float]] = deque()
        self._carry: dict[str, float] = {}
        # The samples of the steps sent, and of those withheld once ``ddptui.log`` took over
        # (see explicit_log): what the script's first call may count again.
        self._samples_sent = 0
        self._withheld = 0
        self._send_lock = threading.RLock()
        self._draining: int | None = None  # the thread delivering steps now (re-entry guard)
        # The first step waits for the next step's start (or a flush): a script that calls
        # ddptui.log itself does so right after it, and explicit logs win.
        self._first_released = False
        self._drainer = Drainer(self._drain, SEND_INTERVAL_S, "ddptui-steps")
        self._atexit = False
        self._get_reporter: Callable[[], Any] | None = None
        self._in_collective = False  # inside a timed collective (nested ones are not timed)
        #: The thread that ended the last step (None before the first): a collective another
        #: thread calls (a gradient compression hook's callback in the backend's thread, an async
        #: checkpoint's) is not the stepping thread's wait, and is not timed as its comm.
        self._step_thread: int | None = None
        self._p2p_noted = False  # the p2p note was sent (see P2P)
        # an evaluation pass (forwards without grad, or in eval mode) since the last segment
        self._eval_start: float | None = None
        self._eval_end: float | None = None
        # The start of the evaluation pass that drew a batch with grad off (its second such
        # batch ends it no sooner than its draw: see _evaluation_drew).
        self._eval_drew: float | None = None
        # The evaluation passes' seconds in the step being timed: out of its step time.
        self._eval_spent = 0.0
        # DistributedSamplers by id; an entry goes with its sampler. Once one note is sent,
        # none is followed.
        self._samplers: dict[int, _SamplerPasses] = {}
        self._sampler_noted = False
        # The entry of the sampler whose pass started last, until a training step marks it
        # (the sampler that step's batches came from); None once marked.
        self._last_pass: _SamplerPasses | None = None
        # The pass of the accelerate loader whose batch was drawn last (see
        # _attach_accelerate): a training forward takes it as the epoch. None: no such loader.
        self._loader_epoch: int | None = None
        self._accelerate_attached = False
        self._transformers_attached = False
        self._lightning_attached: set[str] = set()  # the Lightning packages followed
        self._evaluating = 0  # HF Trainer.evaluate calls under way, one inside another
        self._lightning_running = 0  # Lightning evaluation loops under way
        self._torchmetrics_attached = False
        self._metric_forwards = 0  # torchmetrics forwards under way (a batch's own value)
        self._ignite_attached = False
        #: The data of the ignite ``Engine.run`` calls under way, outermost first; and the
        #: ids of the data (and datasets) of those that ran training steps.
        self._ignite_runs: list[Any] = []
        self._ignite_engines: list[Any] = []  # their engines
        self._ignite_trained: set[int] = set()
        self._fastai_attached = False
        self._speechbrain_attached = False
        #: The modules whose class is followed where a framework has several (TensorBoard's
        #: SummaryWriter in torch and tensorboardX, MMEngine's two runners).
        self._modules_followed: set[str] = set()
        self._wandb_attached = False
        self._batch_noted = False  # the first training batch was looked at (_note_first_batch)
        #: Its digest and rows, until the next training forward (_note_trained_batch).
        self._batch_digest: tuple[int, int | None] | None = None
        #: Numbers a SummaryWriter was given after an evaluation pass, and the epoch training
        #: was in: the pass's evaluation once training goes on (see _tensorboard_logged).
        self._tensorboard_numbers: tuple[int | None, dict[str, Any]] | None = None
        #: The epochs a framework's plan announced (see _plan_epochs); None: none yet.
        self._epochs_planned: int | None = None
        self._steps_ended = 0  # training steps ended in this process
        #: An optimizer's step was seen in this process (the torch.optim hooks fired).
        self._opt_seen = False
        #: Until then, after each training backward of a DDP module: one of its parameters
        #: that got a gradient, that gradient (weakly), its version and the parameter's, to
        #: tell at the next training forward whether the gradient was consumed or the weights
        #: updated (see _grads_discarded).
        self._grad_left: tuple[Any, Any, int, int] | None = None
        #: An evaluation pass (a DDP module's forward not training) ended since the last
        #: training forward, and no accuracy was taken from it yet (see _metric_computed).
        self._evaluated = False
        #: The script reports its evaluations itself (``ddptui.log_eval``): none are taken
        #: from a framework's.
        self.explicit_eval = False

    # -- wiring ----------------------------------------------------------------------------------
    def attach(self, torch: Any) -> None:
        """Register every hook on an imported torch. A hook point this torch lacks is skipped."""
        if self.torch is not None:
            return
        self.torch = torch
        self._grad_enabled = torch.is_grad_enabled
        self._tracing = _recording(torch)
        if not self._atexit:
            # Registered after the reporter's exit handler (the rank entry creates the
            # reporter first), so it runs before it: the last steps go out before the reporter
            # closes, however few steps the script took.
            self._atexit = True
            atexit.register(self.at_exit)
        steps = [
            self._attach_dynamo,
            self._watch_torchmetrics,
            self._watch_ignite,
            self._watch_fastai,
            self._watch_speechbrain,
            self._watch_tensorboard,
            self._watch_wandb,
            self._watch_mmengine,
            self._attach_optimizer,
            self._attach_ddp,
            self._attach_fully_shard,
            self._attach_jit,
            self._attach_backward,
            self._attach_dist_autograd,
            self._attach_dist_optimizer,
            self._attach_scaler,
            self._attach_sampler,
            self._attach_loader,
            self._attach_collectives,
            self._attach_spawn,
            self._attach_process_group,
        ]
        for attach in steps:
            try:
                attach(torch)
            except Exception as exc:  # an older/newer torch without this hook point
                _warn(f"instrumentation: {attach.__name__[8:]} hooks unavailable ({exc})")

    def _when_imported(self, name: str, on_loaded: Callable[[Any], None]) -> None:
        """``on_loaded(module)`` now if module ``name`` is loaded, else right after the
        script (or a library) imports it."""
        module = sys.modules.get(name)
        if module is not None:
            on_loaded(module)
            return
        watcher = _TorchImportWatcher(on_loaded, name)
        sys.meta_path.insert(0, watcher)

        def forget() -> None:
            if watcher in sys.meta_path:
                sys.meta_path.remove(watcher)

        self._undo.append(forget)

    def _attach_dynamo(self, torch: Any) -> None:
        """Have ``torch.compile`` leave ddptui's code alone: now if ``torch._dynamo`` is
        loaded, else when the script (or torch, at its first optimizer) imports it."""
        self._when_imported(_DYNAMO, self._skip_in_dynamo)

    def _skip_in_dynamo(self, dynamo: Any) -> None:
        try:
            rules = dynamo.trace_rules
            before = set(rules.SKIP_DIRS)
            rules.add(ddptui.__name__)
            added = [d for d in rules.SKIP_DIRS if d not in before]
        except Exception as exc:  # a torch without this rule: compiled code traces the hooks
            _warn(f"instrumentation: torch.compile would trace its hooks ({exc})")
            return

        def undo() -> None:
            for skipped in added:
                if skipped in rules.SKIP_DIRS:
                    rules.SKIP_DIRS.remove(skipped)
            rules._recompile_re()

        self._undo.append(undo)

    def detach(self) -> None:
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:
                pass
        self._undo = []
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._outer_posts = {}
        self._outer_pres = {}
        self._inner_owner = {}
        self._direct = weakref.WeakSet()
        for watch in self._watches.values():
            watch.remove()
        self._watches = {}
        self._drainer.stop()
        self.send_ready()  # what can go now; the rest stays (a later flush sends it)

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original))

    def _follow(self, what: str, owner: Any, **wrappers: Any) -> None:
        """Patch a framework's class ``owner`` with ``wrappers`` (attribute name -> wrapper);
        where it is not as the hooks expect, say that ``what`` is not followed and go on
        (training never stops for it)."""
        try:
            for name, wrapper in wrappers.items():
                self._patch(owner, name, wrapper)
        except Exception as exc:
            _warn(f"instrumentation: {what} not followed ({exc})")

    def _attach_optimizer(self, torch: Any) -> None:
        import torch.optim.optimizer as optim

        pre = optim.register_optimizer_step_pre_hook(self._opt_pre)
        post = optim.register_optimizer_step_post_hook(self._opt_post)
        self._undo += [pre.remove, post.remove]

    def _attach_jit(self, torch: Any) -> None:
        """``torch.jit.script`` compiles a module's forward hooks with it, and ddptui's are
        Python it cannot compile: scripting the DDP module's inner module (to save it for
        serving after training) failed under ddptui where it works without. The hooks are
        lifted off while it runs.

        A class it compiles resolves its names in its caller's frame (``_frames_up`` frames
        above it), which was this wrapper's: detectron2's ``@torch.jit.script`` classes
        (``Box2BoxTransformRotated``, at its import) failed with "undefined value torch".
        The wrapper counts itself in."""
        jit = torch.jit
        original = jit.__dict__["script"]
        lifted = self._hooks_lifted

        @functools.wraps(original)
        def script(*args: Any, **kwargs: Any) -> Any:
            if len(args) >= 3 and type(args[2]) is int:  # _frames_up, given in place
                args = (*args[:2], args[2] + 1, *args[3:])
            elif len(args) < 3 and type(kwargs.get("_frames_up", 0)) is int:
                kwargs["_frames_up"] = kwargs.get("_frames_up", 0) + 1
            with lifted():
                return original(*args, **kwargs)

        self._patch(jit, "script", script)

    @contextlib.contextmanager
    def _hooks_lifted(self) -> Iterator[None]:
        """ddptui's module hooks out of their modules for the ``with`` block, then back."""
        lifted: list[tuple[dict, int, Any]] = []
        try:
            for handle in self._handles:
                for ref in (handle.hooks_dict_ref, *handle.extra_dict_ref):
                    hooks = ref()
                    if hooks is not None and handle.id in hooks:
                        lifted.append((hooks, handle.id, hooks.pop(handle.id)))
        except Exception as exc:  # a torch whose handles are not as expected: left on
            _warn(f"instrumentation: torch.jit.script would see its hooks ({exc})")
        try:
            yield
        finally:
            for hooks, key, hook in lifted:
                hooks[key] = hook

    def _attach_ddp(self, torch: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        original = DDP.__init__
        watch_ddp = self.watch
        self._ddp_forward = DDP.forward

        # Every wrapper here takes the instance positionally only (``/``): a caller's keyword
        # may have any name the original takes. Lightning builds its DDP module with
        # ``DistributedDataParallel(module=model, ...)``, and a wrapper whose first parameter
        # was called ``module`` failed that call with "got multiple values for argument".
        @functools.wraps(original)
        def __init__(ddp: Any, /, *args: Any, **kwargs: Any) -> None:
            script = sys._getframe(1)  # the script's own line, DistributedDataParallel(...)
            warned_at_script(script, lambda: original(ddp, *args, **kwargs))
            watch_ddp(ddp)

        self._patch(DDP, "__init__", __init__)

    def _attach_fully_shard(self, torch: Any) -> None:
        """Follow FSDP2's ``fully_shard`` from the import of ``torch.distributed.fsdp`` on,
        for the mesh it shards over, and tensor parallelism's ``parallelize_module`` from the
        import of ``torch.distributed.tensor.parallel`` on, for the mesh whose ranks share
        their batches (see :meth:`_data_parallel`)."""
        self._when_imported(_FSDP, self._follow_fully_shard)
        self._when_imported(_TENSOR_PARALLEL, self._follow_parallelize)

    def _follow_parallelize(self, module: Any) -> None:
        # ``device_mesh`` may come second in place; None: torch's current mesh, not read here
        self._follow_mesh(
            "tensor parallelism's parallelize_module", module, "parallelize_module",
            lambda args, kwargs: kwargs.get("device_mesh", args[1] if len(args) > 1 else None),
            self._tensor_parallel,
        )  # fmt: skip

    def _follow_fully_shard(self, module: Any) -> None:
        # ``mesh`` is keyword-only; None: the world's
        self._follow_mesh(
            "FSDP2's fully_shard", module, "fully_shard",
            lambda args, kwargs: kwargs.get("mesh"), self._data_parallel,
        )  # fmt: skip
        sharded = getattr(module, "FSDPModule", None)
        original = getattr(sharded, "set_gradient_divide_factor", None)
        if not callable(original):
            return

        @functools.wraps(original)
        def set_gradient_divide_factor(fsdp: Any, /, *args: Any, **kwargs: Any) -> Any:
            result = original(fsdp, *args, **kwargs)
            factor = args[0] if args else kwargs.get("factor")
            with contextlib.suppress(Exception):
                self._summed_gradients(fsdp, factor)
            return result

        self._follow(
            "FSDP2's set_gradient_divide_factor", sharded,
            set_gradient_divide_factor=set_gradient_divide_factor,
        )  # fmt: skip

    def _summed_gradients(self, fsdp: Any, factor: Any) -> None:
        """An FSDP2 module's gradients divided by ``factor`` as they are reduced over its
        ranks (``set_gradient_divide_factor``). By 1, they are summed: the script made each
        rank's loss its share of the ranks' (torchtitan divides each rank's summed token
        losses by the tokens of all ranks, 4.0 a rank where its log says 8.0 on 2 ranks), and
        the loss a rank reports is its own times those ranks, which the run's mean over the
        ranks makes the script's. Said once, as the ``summed_loss`` note; any other factor
        leaves the losses as they are."""
        if type(factor) not in (int, float) or factor != 1:
            return
        ranks = _fsdp_ranks(fsdp) or self._world_size() or 1
        if ranks <= 1 or ranks == self._loss_factor:
            return
        self._loss_factor = ranks
        from ddptui.rank import reporter as reporter_module

        reporter_module.get_reporter().note("summed_loss", group_size=ranks)

    def _follow_mesh(
        self,
        what: str,
        module: Any,
        name: str,
        mesh_of: Callable[[tuple, dict], Any],
        then: Callable[[int], None],
    ) -> None:
        """Wrap ``module``'s function ``name`` so that, once it has run, the size of the
        device mesh it was given (``mesh_of(args, kwargs)``) goes to ``then``."""
        original = getattr(module, name, None)
        if not callable(original):
            return

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            mesh = mesh_of(args, kwargs)
            if mesh is not None:
                with contextlib.suppress(Exception):
                    then(int(mesh.size()))
            return result

        self._follow(what, module, **{name: wrapper})

    def _tensor_parallel(self, size: int) -> None:
        """A model split over ``size`` ranks that train on the same batches (tensor
        parallel: pytorch/examples' ``tensor_parallel_example.py``, every rank of the world
        one batch): at most the world over them are data-parallel."""
        world = self._world_size()
        if size > 1 and world:
            self._data_parallel(max(1, world // size))

    def _data_parallel(self, size: int) -> None:
        """This rank's gradients are synchronized over ``size`` ranks (a DDP module's process
        group, the mesh ``fully_shard`` shards over): fewer than the world, the other ranks
        train on the same batches (tensor, pipeline or context parallel: pytorch/examples'
        ``fsdp_tp_example.py`` on 4 ranks, 2 a batch, counted each batch twice). Said once,
        as the ``data_parallel`` note, and again if a smaller group is learned later (a
        tensor parallel split guesses the world over its ranks; a pipeline beside it leaves
        fewer, which the DDP or FSDP group then says)."""
        said = self._data_parallel_said
        if size < 1 or (said is not None and size >= said) or size >= (self._world_size() or 0):
            return
        self._data_parallel_said = size
        from ddptui.rank import reporter as reporter_module

        reporter_module.get_reporter().note("data_parallel", group_size=size)

    def _sampler_replicas(self, it: Any) -> None:
        """A training pass's first batch came from DataLoader iterator ``it``: where its
        DistributedSampler splits the data over fewer replicas than the world's ranks
        (``num_replicas`` the data-parallel degree, as huggingface/picotron's loader makes it
        beside its pipeline, tensor and context parallel ranks), the other ranks train on the
        same batches: said as :meth:`_data_parallel` says a DDP module's smaller group.
        picotron with 2 pipeline stages read 480 samples for the 240 its pipeline trained."""
        sampler = getattr(getattr(it, "_index_sampler", None), "sampler", None)
        replicas = getattr(sampler, "num_replicas", None) if sampler is not None else None
        if type(replicas) is int and replicas >= 1 and hasattr(sampler, "set_epoch"):
            self._data_parallel(replicas)

    def _world_size(self) -> int | None:
        """The world of this rank's default process group (None before it forms)."""
        dist = getattr(self.torch, "distributed", None)
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return int(dist.get_world_size())

    def _attach_backward(self, torch: Any) -> None:
        original = torch.Tensor.backward
        before, after = self._backward_call, self._backward_return
        # A tensor subclass with ``__torch_function__`` (fastai's TensorBase, say) has
        # ``Tensor.backward`` call itself again through that dispatch: one backward, two calls
        # of this wrapper. The inner call is only passed on. Counted as well, each of fastai's
        # losses was read twice and the two added up (as the terms of one objective): twice
        # its own, 5.54 where its learner had 2.77.
        inside = threading.local()
        #: Backwards under way, in any thread (see ``autograd_backward``).
        running = [0]
        inst = self

        def followed(call: Any, tensors: Any, roots: list[Any], args: Any, kwargs: Any) -> Any:
            """``call(tensors, …)``, a backward of ``roots`` (the losses when 0-dim)."""
            for root in roots:
                before(root)
            if len(roots) > 1:  # their gradients are summed: the terms of one objective
                inst._summed_losses = True
            inside.backward = True
            running[0] += 1
            try:
                return call(tensors, *args, **kwargs)
            finally:
                running[0] -= 1
                inside.backward = False
                if roots:
                    after()

        @functools.wraps(original)
        def backward(tensor: Any, /, *args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "backward", False):
                return original(tensor, *args, **kwargs)
            return followed(original, tensor, [tensor], args, kwargs)

        self._patch(torch.Tensor, "backward", backward)

        # ``torch.autograd.backward(tensors, grad_tensors)`` is a backward too: a pipeline
        # stage's (huggingface/picotron's 1F1B schedule calls it on the last stage's loss, and
        # on the others' activations with the gradients the next stage sent back). Its losses
        # read none before: the last stage's loss was ``--`` from the first step to the last.
        # ``Tensor.backward`` calls it (passed on), and so does a reentrant activation
        # checkpoint's backward, inside another backward, maybe on autograd's own thread
        # (passed on: no backward of the step's).
        autograd = sys.modules.get("torch.autograd")
        autograd_original = getattr(autograd, "__dict__", {}).get("backward")
        if autograd_original is None or not callable(autograd_original):
            return
        tensor_class = torch.Tensor

        @functools.wraps(autograd_original)
        def autograd_backward(tensors: Any, /, *args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "backward", False) or running[0]:
                return autograd_original(tensors, *args, **kwargs)
            if isinstance(tensors, tensor_class):
                roots = [tensors]
            elif isinstance(tensors, list | tuple):
                roots = [root for root in tensors if isinstance(root, tensor_class)]
            else:
                roots = []
            return followed(autograd_original, tensors, roots, args, kwargs)

        self._patch(autograd, "backward", autograd_backward)

    # A model that spans processes over torch's RPC (pytorch/examples' ``ddp_rpc``: a DDP
    # module on each trainer, an embedding table on a parameter server) trains with
    # ``dist_autograd.backward(context_id, [loss])`` and ``DistributedOptimizer.step(
    # context_id)``: neither calls ``Tensor.backward`` nor a ``torch.optim`` optimizer's
    # step on the trainer (the owners' functional optimizers step in RPC threads), and the
    # example's 1,000 steps a trainer read "preparing" and 0 samples to their end. They are
    # followed as those are.
    def _attach_dist_autograd(self, torch: Any) -> None:
        """``torch.distributed.autograd.backward`` as a step's backward (absent from a torch
        built without RPC: nothing to follow there)."""
        module = sys.modules.get("torch.distributed.autograd")
        original = getattr(module, "backward", None) if module is not None else None
        if original is None:
            return
        before, after, inst = self._backward_call, self._backward_return, self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            roots = args[1] if len(args) > 1 else kwargs.get("roots")
            if isinstance(roots, list | tuple):
                for root in roots:
                    if isinstance(root, torch.Tensor):
                        before(root)
                # The roots' gradients are summed: several are the terms of one objective.
                if len(roots) > 1:
                    inst._summed_losses = True
            try:
                return original(*args, **kwargs)
            finally:
                after()

        self._patch(module, "backward", backward)

    def _attach_dist_optimizer(self, torch: Any) -> None:
        """``DistributedOptimizer.step`` as a step's optimizer step, once the script imports
        ``torch.distributed.optim``. Its owners' optimizers, stepped by RPC inside it, are
        the same step (a ``torch.optim`` one on this process is a step inside a step)."""
        self._when_imported("torch.distributed.optim", self._follow_dist_optimizer)

    def _follow_dist_optimizer(self, module: Any) -> None:
        cls = getattr(module, "DistributedOptimizer", None)
        original = getattr(cls, "step", None) if isinstance(cls, type) else None
        if not callable(original):
            return
        pre, post = self._opt_pre, self._opt_post

        @functools.wraps(original)
        def step(optimizer: Any, /, *args: Any, **kwargs: Any) -> Any:
            pre(optimizer, (optimizer, *args), kwargs)  # as torch's hooks get them: self first
            result = original(optimizer, *args, **kwargs)
            post(optimizer, (optimizer, *args), kwargs)
            return result

        self._follow("DistributedOptimizer", cls, step=step)

    def _attach_scaler(self, torch: Any) -> None:
        from torch.amp import GradScaler

        original = GradScaler.scale
        on_scale = self._on_scale

        @functools.wraps(original)
        def scale(scaler: Any, /, outputs: Any) -> Any:
            scaled = original(scaler, outputs)
            on_scale(outputs, scaled)
            return scaled

        self._patch(GradScaler, "scale", scale)
        original_step = GradScaler.step
        inst = self
        optimizer_type = torch.optim.Optimizer

        @functools.wraps(original_step)
        def step(scaler: Any, /, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = inst.hook_calls
            result = original_step(scaler, optimizer, *args, **kwargs)
            # No optimizer step ran: the scaler skipped it. Known only of torch's optimizers,
            # whose steps the hooks see: fastai's mixed precision hands the scaler a stand-in
            # (its callback, whose ``step`` only notes that it was called) before its own
            # optimizer steps, and each step ended there, its optimizer in the next one.
            if inst.hook_calls == before and isinstance(optimizer, optimizer_type):
                inst._scaler_skipped(optimizer)
            return result

        self._patch(GradScaler, "step", step)

    def _told_epoch(self, sampler: Any, epoch: int) -> None:
        """``sampler.set_epoch(epoch)``: the rank's epoch, unless another sampler over more
        samples, still alive, told its own. A script that trains from two loaders at once
        numbers each one's passes: kekmodel/FixMatch-pytorch tells its labeled sampler (a few
        thousand images, a pass every 31 steps) and its unlabeled one (the whole dataset,
        every 55) each its own epoch, and the rank's epoch went back and forth between them;
        it is the larger one's now, the passes over the bulk of the data."""
        try:
            size = int(getattr(sampler, "total_size", 0) or len(sampler))
        except Exception:
            size = 0
        leader = self._epoch_sampler() if self._epoch_sampler is not None else None
        if leader is not None and leader is not sampler and size < self._epoch_size:
            return  # a smaller loader's passes (a labeled subset, a validation set)
        self._epoch_sampler = _weak(sampler)  # (None: it takes no weak reference, none leads)
        self._epoch_size = size
        self._epoch = epoch
        self._epoch_told = True
        self._epoch_tells += 1
        self._loader_epoch = None  # the script's own word: an accelerate pass no more

    def _attach_sampler(self, torch: Any) -> None:
        from torch.utils.data.distributed import DistributedSampler

        original = DistributedSampler.set_epoch
        inst = self

        @functools.wraps(original)
        def set_epoch(sampler: Any, /, epoch: int) -> None:
            original(sampler, epoch)
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                inst._told_epoch(sampler, epoch)
            if not inst._sampler_noted and not inst.disabled:
                inst._sampler_told(sampler)

        self._patch(DistributedSampler, "set_epoch", set_epoch)
        original_iter = DistributedSampler.__iter__

        @functools.wraps(original_iter)
        def __iter__(sampler: Any, /) -> Any:
            if not inst._sampler_noted and not inst.disabled and not inst._eval_draw():
                inst._sampler_pass(sampler)
            return original_iter(sampler)

        self._patch(DistributedSampler, "__iter__", __iter__)

    def _attach_loader(self, torch: Any) -> None:
        from torch.utils.data import dataloader

        iterator = dataloader._BaseDataLoaderIter  # both iterators' __next__ is this one
        original = iterator.__next__
        inst = self
        tensor = torch.Tensor
        original_iter = dataloader.DataLoader.__iter__

        @functools.wraps(original_iter)
        def __iter__(loader: Any, /) -> Any:
            inst._iter_at = inst.clock()  # once a pass: no cost on the step path
            if inst._cuda is not None and not inst.disabled:
                try:
                    inst._iter_event = inst._event()
                except Exception:  # no event: the epoch's first step is timed as before
                    inst._iter_event = None
            return original_iter(loader)

        self._patch(dataloader.DataLoader, "__iter__", __iter__)

        @functools.wraps(original)
        def __next__(it: Any, /) -> Any:
            began = inst.clock()
            try:
                batch = original(it)
            except StopIteration:
                pass_it = inst._pass_it
                if pass_it is not None and pass_it() is it:  # the training pass ran to its end
                    inst._pass_ended = True
                elif inst._eval_end is not None:
                    inst._evaluation_closed()  # an evaluation's pass ran to its end
                raise
            if inst._eval_draw():  # an evaluation's batch
                inst.evaluations += 1
                if inst._mark is not None:
                    if inst._eval_start is None:
                        # the evaluation began with the wait for its first batch (its loader's
                        # workers starting: 5.9 s of moco's validation was the next step's),
                        # or with its iterator's making where this is its first: a loader
                        # that forks its workers there (4 of rasbt's, 0.2-0.3 s each pass)
                        made, mark = inst._iter_at, inst._mark
                        first = getattr(it, "_num_yielded", None) == 1
                        fresh = first and made is not None and mark <= made <= began
                        inst._eval_start = made if fresh else began
                    if not inst._grad_enabled():
                        inst._evaluation_drew()
                if not inst.disabled and inst._grad_enabled():
                    # eval mode alone says so: a module that trains in eval mode may draw it
                    # (see _trained_in_eval), which only its backward will tell
                    size, ended = _draw_size(tensor, batch), inst.clock()
                    inst._mode_draw = (weakref.ref(it), size, began, ended)
                return batch
            inst._training_draw(it, _draw_size(tensor, batch), began, inst.clock(), batch)
            return batch

        self._patch(iterator, "__next__", __next__)
        workers = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
        shutdown = getattr(workers, "_shutdown_workers", None)
        if shutdown is not None:

            @functools.wraps(shutdown)
            def _shutdown_workers(it: Any, /) -> None:
                try:
                    shutdown(it)
                finally:
                    if inst._eval_end is not None:
                        inst._evaluation_closed()

            self._patch(workers, "_shutdown_workers", _shutdown_workers)

    def _evaluation_closed(self) -> None:
        """An evaluation's loader closed: it ran out, or the pass left it (rasbt's
        LLMs-from-scratch evaluates every 5 steps on one batch of each loader, each with 4
        workers, and ``break``s), and its workers were shut down. That wait is the
        evaluation's too: it was the next step's ``other`` (0.40-0.50 s, median, of 2 s steps),
        as an evaluation ends with its last forward or draw. Only with grad off or the models
        in eval mode, as its draws were: a training loader's end is no evaluation's. Never
        raises (it runs in an iterator's ``__del__``, at the interpreter's exit too)."""
        try:
            if self._eval_start is not None and self._mark is not None and self._eval_draw():
                self._eval_end = self.clock()
        except Exception:  # noqa: BLE001 - nothing of ddptui's may fail a script's loader
            pass

    def _evaluation_drew(self) -> None:
        """A batch was drawn with grad off, in an evaluation pass begun since the last
        training forward. From its second such batch the pass lasts to this draw's end at
        least, whatever model it runs: an evaluation of a model no DDP module wraps (YOLOv5's
        ``train.py`` validates its EMA copy, on rank 0 only) shows no evaluation forward, and
        its 81 s were the next step's (``other`` on rank 0, ``comm`` on rank 1 waiting in a
        broadcast): the run's rate read 0.76 samples/s where its steps made 27. One batch
        alone may be a training batch drawn under ``no_grad`` (a training forward ends such a
        pass before its second)."""
        if self._eval_drew == self._eval_start:
            self._eval_end = self.clock()
        else:
            self._eval_drew = self._eval_start

    def _training_draw(
        self, it: Any, size: int, began: float, ended: float, batch: Any = None
    ) -> None:
        """A training batch (``batch``) of ``size`` samples came from DataLoader iterator
        ``it``, waited for from ``began`` to ``ended``: the pass (the epoch) and the step's
        draws."""
        suspect = self._suspect
        if suspect is not None and suspect[0]() is not it:  # (an id may be a dead one's)
            self._suspect = None
            if self._untrained(suspect):
                self._untrained_pass(suspect[3], suspect[4], began)
        if getattr(it, "_num_yielded", None) == 1:  # a training pass's first batch
            if not self._batch_noted:
                self._note_first_batch(it, batch)
            if self._passes >= 0 and (self._pass_ended or self._pass_batches > 1):
                self._between_passes()  # another epoch: the time between them is none's
            undo = {name: getattr(self, name) for name in _PASS_STATE}
            undo["_module_samples"] = self._module_samples.copy()
            if self._cuda is None:
                undo["_acc"] = self._acc.copy()
            else:
                undo["_marks"] = list(self._marks)
            ref = weakref.ref(it)
            self._suspect = (ref, self._grad_calls, self._fwd_calls, began, undo)
            self._loader_pass(ref)
            self._check_restart(it, ended)
            self._sampler_replicas(it)
            if self._pass_length is None:
                length, limit = _pass_length(it), self._pass_limit
                if limit:  # an IterableDataset's too, which has no length
                    length = min(length or limit, limit)
                self._pass_length = length
                self._length_it = ref
        if self._mark is None and self._first_draw is None:  # before the first step
            self._first_draw = ended
        self._pass_batches += 1
        self._draws += 1
        length_it = self._length_it
        if length_it is not None and length_it() is it:
            self._length_draws += 1
        data = id(getattr(it, "_dataset", it))
        if data != self._loader_data:
            # Another loader's: its batches, not the last one's, are the step's. A new pass
            # of the same loader counted afresh lost the batch accelerate's shard had drawn
            # ahead: lucidrains/denoising-diffusion-pytorch's Trainer (two micro-batches a
            # step, 13 batches a pass) counted 8 samples for a step of 16 once a pass. But a
            # second training loader in the same DDP step (kekmodel/FixMatch-pytorch: a
            # labeled batch, then an unlabeled one, every step) adds to the step's samples,
            # which its forwards bound: it counted only the unlabeled batch, 8 of 12 a step.
            if self._draws < 2 or not (self._ddp_seen or self._models):
                self._loader_samples = 0
            self._loader_data, self._drawn_ahead = data, 0
        self._loader_samples += size
        wait = self._step_wait
        self._step_wait = (wait or 0.0) + (ended - began)

    def _note_first_batch(self, it: Any, batch: Any) -> None:
        """The first batch of a training pass over DataLoader iterator ``it``, the first
        while this rank holds a DDP module (data parallel: tensor- and pipeline-parallel ranks
        draw the same batches by design, and hold none): its digest goes out where the loader
        gives this rank the whole dataset (see :mod:`ddptui.rank.first_batch`), for the ranks'
        batches to be compared. Once; a look once a pass until then."""
        if batch is None or self.disabled or not self._models or not self.holds_ddp():
            return  # None: a batch drawn in eval mode, known as training's later
        self._batch_noted = True
        from ddptui.rank.first_batch import batch_rows, first_batch_digest

        digest = first_batch_digest(self.torch, it, batch)
        if digest is not None:  # sent with what the next training forward takes of it
            self._batch_digest = (digest, batch_rows(self.torch, batch))

    def _note_trained_batch(self, args: tuple, kwargs: dict) -> None:
        """The first training forward since the first batch's digest: the note goes out with
        what the forward took (see :func:`ddptui.rank.first_batch.trained_digest`)."""
        (digest, rows), self._batch_digest = self._batch_digest, None
        from ddptui.rank.first_batch import trained_digest

        digest = trained_digest(self.torch, digest, rows, args, kwargs)
        if digest is not None:
            from ddptui.rank import reporter as reporter_module

            reporter_module.get_reporter().note("first_batch", digest=digest)

    def _untrained_pass(self, began: float, undo: dict[str, Any], end: float) -> None:
        """The pass whose first batch came at ``began`` drew two batches or more, with no
        backward nor step since, and another loader draws now (at ``end``): it was an
        evaluation with grad on and its modules in training mode (forwards, never a
        backward), not a training pass. What its first batch changed is undone (the epoch,
        the step's samples and draws) and its time, from its first batch to now, is
        ``eval``, out of the step's time (on a GPU, out of the step's time only).
        facebookresearch/dlrm evaluates so, every ``--test-freq`` batches in the middle of its
        epoch: its 200 test batches were taken for an epoch of their own (2 epochs read
        ``epoch 4``) and for the next step's samples and time (51,456 samples in 7.5 s).
        An epoch a sampler was told since stands: minGPT-ddp's next ``set_epoch``, taken
        back, put its second epoch's steps in the first."""
        told = undo["_epoch_tells"] != self._epoch_tells
        for name, value in undo.items():
            if not (told and name == "_epoch"):  # a set_epoch since: the script's word
                setattr(self, name, value)
        if self._mark is not None:  # after a step began: the span is its evaluation
            self._eval_start, self._eval_end = began, end

    def _loader_pass(self, it: weakref.ref) -> None:
        """A training pass over a DataLoader began (its iterator's first batch, ``it`` a weak
        reference to it, not an evaluation's: see :meth:`_eval_draw`). Where no
        DistributedSampler was told an epoch (timm's ``train.py`` or pytorch/examples'
        ImageNet script on one device, a script sharding an IterableDataset itself), the epoch
        is the pass of the accelerate loader the batch came through (the HF Trainer in one
        process), else the passes counted from 0. The pass before counts only if it ran to
        its end or gave more than one batch: a script that draws each step's batch with
        ``next(iter(loader))`` starts a pass every step, and has no epochs."""
        if self._passes < 0 or self._pass_ended or self._pass_batches > 1:
            self._passes += 1
        self._pass_it, self._pass_batches, self._pass_ended = it, 0, False
        if not self._epoch_told:  # an accelerate loader's pass, where it is one
            self._epoch = self._passes if self._loader_epoch is None else self._loader_epoch

    def _check_restart(self, it: Any, ended: float) -> None:
        """A training pass's first batch came at ``ended`` from DataLoader iterator ``it``:
        where the loader starts its workers anew each pass (``persistent_workers`` False) and
        this pass waited for them :data:`LOADER_RESTART_S` or more, and at least
        :data:`LOADER_RESTART_SHARE` of the pass before, a note says so, once. ijepa's loader
        (2 workers, spawned) waited 26-29 s at each pass of 8 steps of 0.6 s on two cores: the
        first steps' ``data``, out of sight in the median phases."""
        began, asked = self._pass_began, self._iter_at
        self._pass_began = ended
        if self._restart_noted or began is None or asked is None or asked < began:
            return
        workers = getattr(it, "_num_workers", 0)
        if type(workers) is not int or workers < 1 or getattr(it, "_persistent_workers", True):
            return
        wait = ended - asked
        if wait < LOADER_RESTART_S or wait < LOADER_RESTART_SHARE * (asked - began):
            return
        self._restart_noted = True
        from ddptui import protocol
        from ddptui.rank import reporter as reporter_module

        top = protocol.MAX_NOTE_NUMBER
        reporter_module.get_reporter().note(
            "loader_restart",
            workers=min(workers, protocol.MAX_GROWN_WORLD),
            seconds=min(round(wait), top),
            passes=min(self._passes + 1, top) if self._passes >= 1 else None,
        )

    def _between_passes(self) -> None:
        """A training pass over a DataLoader began after the last one ended (another epoch, as
        :meth:`_loader_pass` counts them), and no training forward since the last step: what
        the script did between the two (its evaluation, its BatchNorm statistics all-reduced,
        rank 0's checkpoint) is no step's. The epoch's first step starts where its iterator
        was asked for, its first batch's wait (and the workers' start) in its ``data``, as
        timm's ``train.py`` and pytorch/examples' ImageNet script time it. Before, the time
        between them went into that step: 0.67 s and 0.82 s of timm's 0.15 s steps, most of
        it as ``data``, and the mean rate over the run read 71 samples/s where the script
        printed about 100."""
        made, start = self._iter_at, self._step_start
        if (
            self.disabled
            or made is None
            or (self._cuda is not None and self._iter_event is None)
            or start is None
            or self._mark is None
            or made < start  # asked for before the last step ended: no gap to leave out
            or self._fwd_seen
            or self._seg != "data"
        ):
            return
        self._acc = _NO_PHASES.copy()
        self._step_wait = None  # the first batch's wait is added after this
        self._eval_spent = 0.0
        self._eval_start = self._eval_end = None
        self._t_grad = None
        self._seg, self._mark, self._step_start = "data", made, made
        if self._cuda is not None:  # the device's time from then on
            self._marks = [("start", self._iter_event)]

    def _attach_accelerate(self) -> None:
        """The epoch of a loader HF accelerate shards (``Accelerator.prepare``, the HF
        Trainer): it has no DistributedSampler; its ``iteration`` is the pass it is in (its
        ``__iter__`` starts with ``set_epoch(iteration)``, the Trainer's ``set_epoch(epoch)``
        sets it, a finished pass adds one). Each batch drawn notes its loader's pass, and a
        training forward takes the pass of the batch drawn last as the epoch, so that an
        evaluation loader's passes, drawn between training steps, never count. Attached when
        a DDP module is made (accelerate makes it in ``prepare``), if accelerate is loaded."""
        module = sys.modules.get("accelerate.data_loader")
        if module is None:
            return
        self._accelerate_attached = True
        for name in ("DataLoaderShard", "DataLoaderDispatcher"):
            cls = getattr(module, name, None)
            if isinstance(cls, type) and "__iter__" in cls.__dict__:
                self._follow(
                    f"accelerate's {name}",
                    cls,
                    __iter__=self._passes_noted(cls.__dict__["__iter__"]),
                )
        # ``Accelerator.log(values)``: what the script hands its trackers (accelerate's
        # complete_cv_example: ``{"accuracy": …, "train_loss": …, "epoch": …}`` after each
        # evaluation). Called on every rank (only the main one's body runs: on_main_process).
        found = _own_methods(sys.modules.get("accelerate.accelerator"), "Accelerator", "log")
        if found is not None:
            self._follow_log("accelerate's logged evaluations", found, "values")

    def _follow_log(self, what: str, found: tuple[type, list[Any]], keyword: str) -> None:
        """Wrap a framework's ``log(values)`` (its class and method, ``found``; ``keyword``:
        the name of its values' argument): what it is given goes to :meth:`_values_logged`
        after an evaluation pass."""
        cls, (original,) = found
        inst = self

        @functools.wraps(original)
        def log(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
            if inst._evaluated:  # cheap where training logs each step
                inst._values_logged(args[0] if args else kwargs.get(keyword))
            return original(owner, *args, **kwargs)

        self._follow(what, cls, log=log)

    def _values_logged(self, values: Any) -> None:
        """The script gave ``Accelerator.log`` (or ``wandb.log``) these ``values``. After an
        evaluation pass (a DDP module's forwards not training) and before the next training
        forward, an accuracy among them (:data:`ACCURACY_WORDS`) or a loss named as an
        evaluation's (``val_loss``, ``eval_loss``: a plain ``loss`` is the training's, logged
        each step by accelerate's examples) is that evaluation, of the epoch training is in,
        with the other numbers as its extras; numbers named for training (``train_loss``) are
        left out. Once per pass; never once the script reports its own evaluations, nor
        inside an HF Trainer's or Lightning's evaluation (reported as theirs)."""
        if self.disabled or self.explicit_eval:
            return
        evaluated, epoch = self._after_evaluation()
        if not evaluated or not isinstance(values, dict) or self._in_framework_eval():
            return
        try:
            if self._logged_eval(self._logged_numbers(values, {}), epoch):
                self._evaluated = False
        except Exception as exc:
            self._fail(exc)

    def _after_evaluation(self) -> tuple[bool, int | None]:
        """Whether an evaluation pass ran since the last training forward, and the epoch
        training is in: a pass of DDP forwards not training, or a pass of two batches or more
        drawn with grad on and no backward since it began (see :meth:`_untrained_pass`; dlrm
        logs its test accuracy to TensorBoard before its training loader draws again)."""
        if self._evaluated:
            return True, self._epoch
        suspect = self._suspect
        if suspect is not None and self._untrained(suspect):
            return True, suspect[4]["_epoch"]
        return False, self._epoch

    def _untrained(self, suspect: tuple[weakref.ref, int, int, float, dict[str, Any]]) -> bool:
        """Whether the pass begun at ``suspect`` (see :attr:`_suspect`) drew two batches or
        more and made two forwards or more, with no backward since it began (a step's two
        batches of one loader, drawn before its forward, are no evaluation). With grad on
        (dlrm's) or off: pytorch/examples' minGPT-ddp draws its test batches with grad on
        and turns it off around each forward, its model training; that pass was the next
        epoch's first step's ``forward`` (0.61-0.75 s where a step takes 0.08)."""
        return (
            suspect[1] == self._grad_calls
            and self._fwd_calls - suspect[2] > 1
            and self._pass_batches > 1
        )

    def _in_framework_eval(self) -> bool:
        """An HF Trainer's or Lightning's evaluation is under way: it reports its pass itself
        (what its loggers are given meanwhile is no other evaluation)."""
        return bool(self._evaluating or self._lightning_running)

    def _watch_wandb(self, torch: Any) -> None:
        """Follow Weights & Biases' ``Run.log`` from its import on, or now where loaded."""
        self._when_imported(_WANDB, self._attach_wandb)

    def _attach_wandb(self, module: Any) -> None:
        """The evaluations a script logs to Weights & Biases: ``wandb.log({"val/loss": …})``
        after its evaluation pass (nanoGPT with ``wandb_log=True``: ``train/loss``,
        ``val/loss``, ``lr``, ``mfu`` on the master process), by the rule of
        ``Accelerator.log`` (:meth:`_values_logged`): one call holds them all."""
        found = self._unfollowed("_wandb_attached", module, _WANDB, "Run", "log")
        if found is not None:
            self._follow_log("Weights & Biases' logged evaluations", found, "data")

    def _logged_numbers(self, values: dict[Any, Any], into: dict[str, Any]) -> dict[str, Any]:
        """``into``, with the numbers among ``values`` that a script logged (by name) not
        named for training (``train_loss``), at most :data:`HF_EXTRA_METRICS` + 2 of them,
        the first of each name kept."""
        tensor = self.torch.Tensor
        for key, value in values.items():
            if len(into) >= HF_EXTRA_METRICS + 2:
                break
            if _logged_scalar(value, tensor) and not _words(key) & TRAINING_WORDS:
                into.setdefault(str(key), value)
        return into

    def _logged_eval(self, numbers: dict[str, Any], epoch: int | None) -> bool:
        """Report the evaluation of ``epoch`` among a script's logged ``numbers`` (not
        training's, :meth:`_logged_numbers`): an accuracy (:data:`ACCURACY_WORDS`), or a loss
        named as an evaluation's (``val_loss``, ``test/loss``: a plain ``loss`` is the
        training's), with the other numbers as its extras. Whether there was one."""
        accuracy_name = _metric_named(numbers, ACCURACY_WORDS)
        loss_name = _metric_named((k for k in numbers if _words(k) & EVALUATION_WORDS), LOSS_WORDS)
        if loss_name is None and accuracy_name is None:
            return False
        loss = numbers.pop(loss_name) if loss_name is not None else None
        accuracy = numbers.pop(accuracy_name) if accuracy_name is not None else None
        self._framework_eval(loss, accuracy, numbers, epoch)
        return True

    def _watch_tensorboard(self, torch: Any) -> None:
        """Follow TensorBoard's ``SummaryWriter`` (torch's and tensorboardX's) from their
        import on, or now where loaded."""
        for name in _TENSORBOARD:
            self._when_imported(name, self._attach_tensorboard)

    def _attach_tensorboard(self, module: Any) -> None:
        """The evaluations a script logs to TensorBoard: ``writer.add_scalar("accuracy",
        …)`` after its test pass (kubeflow's PyTorch MNIST example, through tensorboardX), or
        ``add_scalars``. See :meth:`_tensorboard_logged`."""
        found = self._module_unfollowed(module, "SummaryWriter", "add_scalar", "add_scalars")
        if found is None:
            return
        cls, (scalar, scalars) = found
        inst = self

        @functools.wraps(scalar)
        def add_scalar(writer: Any, /, *args: Any, **kwargs: Any) -> Any:
            # cheap where training logs its loss each step (no pass begun since the last)
            if inst._evaluated or inst._suspect is not None:
                tag = kwargs.get("tag", args[0] if args else None)
                value = kwargs.get("scalar_value", args[1] if len(args) > 1 else None)
                inst._tensorboard_logged({tag: value})
            return scalar(writer, *args, **kwargs)

        @functools.wraps(scalars)
        def add_scalars(writer: Any, /, *args: Any, **kwargs: Any) -> Any:
            if inst._evaluated or inst._suspect is not None:
                main = kwargs.get("main_tag", args[0] if args else None)
                values = kwargs.get("tag_scalar_dict", args[1] if len(args) > 1 else None)
                if isinstance(values, dict):
                    inst._tensorboard_logged({f"{main}/{k}": v for k, v in values.items()})
            return scalars(writer, *args, **kwargs)

        self._follow(
            "TensorBoard's logged evaluations", cls, add_scalar=add_scalar, add_scalars=add_scalars
        )

    def _tensorboard_logged(self, values: dict[Any, Any]) -> None:
        """A SummaryWriter was given ``values`` (tag -> number) after an evaluation pass (a
        DDP module's forwards not training). A script logs one number a call, its loss and
        accuracy in turn: they are kept, with the epoch training is in, and become the pass's
        evaluation (:meth:`_logged_eval`) when training goes on, or the process ends (the
        last epoch's); unless a framework or the script reports it meanwhile."""
        if self.disabled or self.explicit_eval or self._in_framework_eval():
            return
        evaluated, epoch = self._after_evaluation()
        if not evaluated:
            return
        try:
            if self._tensorboard_numbers is None:
                self._tensorboard_numbers = (epoch, {})
            self._logged_numbers(values, self._tensorboard_numbers[1])
        except Exception as exc:
            self._fail(exc)

    def _tensorboard_eval(self) -> None:
        """Report what a SummaryWriter was given after the last evaluation pass, if it is an
        evaluation (see :meth:`_tensorboard_logged`)."""
        kept, self._tensorboard_numbers = self._tensorboard_numbers, None
        if kept is None or self.disabled or self.explicit_eval:
            return
        try:
            epoch, numbers = kept
            self._logged_eval(numbers, epoch)
        except Exception as exc:
            self._fail(exc)

    def _attach_transformers(self) -> None:
        """The HF Trainer's evaluations: ``Trainer.evaluate`` returns what it logs, gathered
        from every rank (``eval_loss``; ``eval_accuracy`` when ``compute_metrics`` gives an
        ``accuracy``), the same on each; each call becomes an evaluation of the epoch the
        training is in (see :meth:`_trainer_evaluated`). And its training loss: the Trainer
        logs the sum of what its ``training_step`` calls send into ``backward()`` over an
        optimizer step's micro-batches, which it divides so that they add up (by the
        accumulation steps; or, where the model takes ``num_items_in_batch``, by the items
        of the window on this rank, which the graph cannot tell from a mean's division). A
        step whose micro-batches went through it reports that sum. Attached when a DDP
        module is made (the Trainer makes it when it trains), if transformers' Trainer is
        loaded."""
        module = sys.modules.get("transformers.trainer")
        if module is None:
            return
        self._transformers_attached = True
        cls = getattr(module, "Trainer", None)
        if not isinstance(cls, type):
            return
        inst = self
        training_step = cls.__dict__.get("training_step")
        if callable(training_step):

            @functools.wraps(training_step)
            def step(trainer: Any, /, *args: Any, **kwargs: Any) -> Any:
                inst._summed_losses = True
                # Its plan: whole epochs where no max_steps cuts the last one short (read
                # until one is announced, not at every micro-batch after).
                if inst._epochs_planned is None and getattr(
                    getattr(trainer, "args", None), "max_steps", 0
                ) in (0, -1, None):
                    inst._plan_epochs(
                        getattr(getattr(trainer, "state", None), "num_train_epochs", 0)
                    )
                return training_step(trainer, *args, **kwargs)

            self._follow("the HF Trainer's training loss", cls, training_step=step)
        original = cls.__dict__.get("evaluate")
        if not callable(original):
            return

        @functools.wraps(original)
        def evaluate(trainer: Any, /, *args: Any, **kwargs: Any) -> Any:
            inst._evaluating += 1
            try:
                metrics = original(trainer, *args, **kwargs)
            finally:
                inst._evaluating -= 1
                inst._evaluated = False  # its pass is the Trainer's, reported as such
            if inst._evaluating == 0:  # several eval datasets: one call each, inside this one
                prefix = kwargs.get("metric_key_prefix", args[2] if len(args) > 2 else "eval")
                dataset = kwargs.get("eval_dataset", args[0] if args else None)
                if dataset is None:
                    dataset = getattr(trainer, "eval_dataset", None)
                names = dataset if isinstance(dataset, dict) else ()
                inst._trainer_evaluated(metrics, prefix, names)
            return metrics

        self._follow("the HF Trainer's evaluations", cls, evaluate=evaluate)

    def _attach_lightning(self) -> None:
        """PyTorch Lightning's validations: ``_EvaluationLoop.run`` returns, per validation
        loader, the numbers ``self.log`` recorded for the epoch (``val_loss``; with
        ``sync_dist=True`` all-reduced, else this rank's own, which is what Lightning prints
        and logs on rank 0). Each run of the loop in the validation stage, past the sanity
        check, becomes an evaluation of the epoch the training is in (see
        :meth:`_lightning_validated`). Attached when a DDP module is made (the strategy makes
        it before the sanity check), if Lightning's loop is loaded (``lightning.pytorch`` or
        ``pytorch_lightning``)."""
        inst = self

        def validations(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def run(loop: Any, /, *args: Any, **kwargs: Any) -> Any:
                inst._lightning_running += 1
                try:
                    outputs = original(loop, *args, **kwargs)
                finally:
                    inst._lightning_running -= 1
                    inst._evaluated = False  # its pass is Lightning's, reported as such
                stage = getattr(loop, "_stage", None)
                trainer = getattr(loop, "trainer", None)
                if getattr(stage, "value", stage) == "validate" and not getattr(
                    trainer, "sanity_checking", False
                ):
                    inst._lightning_validated(outputs)
                return outputs

            return run

        def training_epochs(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def run(loop: Any, /, *args: Any, **kwargs: Any) -> Any:
                # The batches Lightning takes from the training loader this epoch:
                # ``limit_train_batches`` (20 of the 860 its loader holds on each of 2 ranks
                # in its backbone example: the first epoch's ETA was 43 times too long).
                trainer = getattr(loop, "trainer", None)
                batches = getattr(trainer, "num_training_batches", 0)
                if type(batches) is int and batches > 0:
                    inst._pass_limit = batches
                # Its plan: max_epochs (1,000 where neither it nor max_steps is given), unless
                # max_steps ends the run first.
                if getattr(trainer, "max_steps", -1) in (-1, None):
                    inst._plan_epochs(getattr(trainer, "max_epochs", None))
                return original(loop, *args, **kwargs)

            return run

        for modules, class_name, what, wrap in (
            (LIGHTNING_LOOPS, "_EvaluationLoop", "Lightning's validations", validations),
            (LIGHTNING_TRAINING_LOOPS, "_TrainingEpochLoop", "Lightning's epochs", training_epochs),
        ):
            for name in modules:
                found = _own_methods(sys.modules.get(name), class_name, "run")
                if name in self._lightning_attached or found is None:
                    continue
                cls, (original,) = found
                self._lightning_attached.add(name)
                self._follow(what, cls, run=wrap(original))

    def _watch_torchmetrics(self, torch: Any) -> None:
        """Follow torchmetrics from its import on, or now if it is loaded: a script often
        makes its accuracy before its DDP module."""
        self._when_imported(_TORCHMETRICS, self._attach_torchmetrics)

    def _attach_torchmetrics(self, module: Any = None) -> None:
        """torchmetrics' accuracies, computed after an evaluation pass: a ``Metric`` wraps
        its ``compute`` when made (``Metric._wrap_compute``), and the wrapped compute gathers
        the metric's state from every rank, so that each rank gets the same accuracy of the
        whole evaluation set (Lightning Fabric's examples print it; see
        :meth:`_metric_computed`). Attached when ``torchmetrics.metric`` is imported (it
        imports torch first: every metric is made after), else with the other frameworks."""
        if self._torchmetrics_attached:
            return
        if module is None:
            module = sys.modules.get(_TORCHMETRICS)
        found = _own_methods(module, "Metric", "_wrap_compute", "forward")
        if found is None:
            return
        cls, (wrap_compute, forward) = found
        self._torchmetrics_attached = True
        inst = self

        @functools.wraps(wrap_compute)
        def _wrap_compute(metric: Any, compute: Callable[..., Any]) -> Callable[..., Any]:
            wrapped = wrap_compute(metric, compute)

            @functools.wraps(wrapped)
            def computed(*args: Any, **kwargs: Any) -> Any:
                value = wrapped(*args, **kwargs)
                if inst._evaluated and not inst._metric_forwards:
                    inst._metric_computed(metric, value)
                return value

            return computed

        # ``metric(preds, target)`` computes the batch's own value (unsynchronised): a
        # compute inside a forward is not the evaluation's.
        @functools.wraps(forward)
        def forward_counted(metric: Any, /, *args: Any, **kwargs: Any) -> Any:
            inst._metric_forwards += 1
            try:
                return forward(metric, *args, **kwargs)
            finally:
                inst._metric_forwards -= 1

        self._follow(
            "torchmetrics' accuracies", cls, forward=forward_counted, _wrap_compute=_wrap_compute
        )

    def _metric_computed(self, metric: Any, value: Any) -> None:
        """A torchmetrics metric computed ``value`` after an evaluation pass and before the
        next training forward: an accuracy (its class's name says so: ``Accuracy``,
        ``MulticlassAccuracy``, ``BinaryAccuracy``…) with one value is that evaluation's
        accuracy, of the epoch training is in; once per pass (a script that computes it
        again to print it reports it once). Not inside or after the HF Trainer's or
        Lightning's own evaluations (they are reported as theirs; Lightning logs a training
        accuracy at the epoch's end, after its validation), nor once the script reports its
        own."""
        if (
            self.disabled
            or self.explicit_eval
            or self._evaluating
            or self._lightning_running
            or "Accuracy" not in type(metric).__name__
        ):
            return
        try:
            tensor = self.torch.Tensor
            if isinstance(value, tensor):
                if value.numel() != 1 or not value.is_floating_point():
                    return
            elif _plain_number(value) is None:
                return
            self._evaluated = False
            self._framework_eval(None, value, {})
        except Exception as exc:
            self._fail(exc)

    def _unfollowed(
        self, flag: str, module: Any, name: str, class_name: str, *methods: str
    ) -> tuple[type, list[Any]] | None:
        """A framework's class ``class_name`` and its ``methods`` to wrap (see
        :func:`_own_methods`), from ``module`` or the loaded module ``name``; None when it is
        followed already (the attribute ``flag``) or not there. Marks it followed."""
        if getattr(self, flag):
            return None
        found = _own_methods(
            module if module is not None else sys.modules.get(name), class_name, *methods
        )
        if found is not None:
            setattr(self, flag, True)
        return found

    def _module_unfollowed(
        self, module: Any, class_name: str, *methods: str
    ) -> tuple[type, list[Any]] | None:
        """``module``'s class ``class_name`` and its ``methods`` to wrap (see
        :func:`_own_methods`); None when that module is followed already or they are not
        there. Marks the module followed."""
        name = str(getattr(module, "__name__", None))
        if name in self._modules_followed:
            return None
        found = _own_methods(module, class_name, *methods)
        if found is not None:
            self._modules_followed.add(name)
        return found

    def _watch_ignite(self, torch: Any) -> None:
        """Follow PyTorch Ignite's engines from its import on, or now if it is loaded."""
        self._when_imported(_IGNITE, self._attach_ignite)

    def _attach_ignite(self, module: Any = None) -> None:
        """PyTorch Ignite's evaluations: a script makes an evaluator ``Engine`` and runs it
        (``evaluator.run(val_loader)``), usually from a handler of its trainer's epoch end;
        the metrics attached to it (``Accuracy``, ``Loss``) are all-reduced over the ranks
        when the run completes and left in ``engine.state.metrics``, the same on each rank
        (see :meth:`_ignite_ran`). Attached when ``ignite.engine.engine`` is imported, else
        with the other frameworks."""
        found = self._unfollowed("_ignite_attached", module, _IGNITE, "Engine", "run")
        if found is None:
            return
        cls, (original,) = found
        inst = self

        @functools.wraps(original)
        def run(engine: Any, /, *args: Any, **kwargs: Any) -> Any:
            data = kwargs.get("data", args[0] if args else None)
            before = inst._steps_ended
            inst._ignite_runs.append(data)
            inst._ignite_engines.append(engine)
            try:
                state = original(engine, *args, **kwargs)
            finally:
                inst._ignite_runs.pop()
                inst._ignite_engines.pop()
            inst._ignite_ran(engine, data, before)
            return state

        self._follow("ignite's evaluations", cls, run=run)

    def _ignite_ran(self, engine: Any, data: Any, before: int) -> None:
        """An ignite engine's run over ``data`` completed. One that ended training steps is
        a trainer: its data is training data from then on. One that ended none, after an
        evaluation pass (a DDP module's forwards not training), is an evaluator: its metrics
        (the ones :func:`_metric_named` finds a loss and an accuracy, the other numbers as
        extras) are an evaluation of the epoch training is in; unless it ran over training
        data: the loader of a trainer running around it or of one that ran before (ignite's
        CIFAR-10 example evaluates its training set too, then its test set), or data drawn
        from that loader's dataset (a ``Subset`` of it: ignite's ImageNet reference). Not two
        ``random_split`` parts of one dataset: the training part is the trainer's dataset, and
        the validation part no subset of it. Nor when the script reports evaluations itself."""
        if self.disabled:
            return
        try:
            if self._steps_ended != before:
                if len(self._ignite_trained) < MAX_IGNITE_TRAINED:
                    self._ignite_trained |= _data_keys(data, 1)
                return
            evaluated, self._evaluated = self._evaluated, False
            if not evaluated or self.explicit_eval:
                return
            keys = _data_keys(data, MAX_DATA_DEPTH)
            if keys & self._ignite_trained or any(
                keys & _data_keys(around, 1) for around in self._ignite_runs
            ):
                return
            metrics = getattr(getattr(engine, "state", None), "metrics", None)
            if not isinstance(metrics, dict):
                return
            tensor = self.torch.Tensor
            self._metrics_eval({str(k): v for k, v in metrics.items() if _logged_scalar(v, tensor)})
        except Exception as exc:
            self._fail(exc)

    def _metrics_eval(self, numbers: dict[str, Any]) -> None:
        """A framework's evaluation ``numbers`` (name -> value): the loss and the accuracy
        :func:`_metric_named` finds among them, the other numbers as its extras; nothing
        unless one of the two is there."""
        loss_name = _metric_named(numbers, LOSS_WORDS)
        accuracy_name = _metric_named(numbers, ACCURACY_WORDS)
        if loss_name is None and accuracy_name is None:
            return
        loss = numbers.pop(loss_name) if loss_name is not None else None
        accuracy = numbers.pop(accuracy_name) if accuracy_name is not None else None
        self._framework_eval(loss, accuracy, numbers)

    def _watch_fastai(self, torch: Any) -> None:
        """Follow fastai's learners from its import on, or now if it is loaded."""
        self._when_imported(_FASTAI, self._attach_fastai)

    def _attach_fastai(self, module: Any = None) -> None:
        """fastai's validations: a ``Learner`` validates at each epoch's end of ``fit`` (and
        when asked, ``learn.validate()``), and its ``Recorder`` keeps the pass's numbers when
        it ends: the validation loss (``loss``) and the learner's metrics (``accuracy``...),
        computed over every rank's predictions (fastai's distributed loaders gather them),
        the same on each rank. Reported from ``Recorder.after_validate``; attached when
        ``fastai.learner`` is imported."""
        found = self._unfollowed("_fastai_attached", module, _FASTAI, "Recorder", "after_validate")
        if found is None:
            return
        cls, (original,) = found
        inst = self

        @functools.wraps(original)
        def after_validate(recorder: Any, /, *args: Any, **kwargs: Any) -> Any:
            result = original(recorder, *args, **kwargs)
            inst._fastai_validated(recorder)
            return result

        self._follow("fastai's validations", cls, after_validate=after_validate)
        # Its plan: ``Learner.fit(n_epoch, …)``, which fit_one_cycle and the others call.
        found = _own_methods(module or sys.modules.get(_FASTAI), "Learner", "fit")
        if found is not None:
            learner_cls, (fit,) = found

            @functools.wraps(fit)
            def planned_fit(learner: Any, /, *args: Any, **kwargs: Any) -> Any:
                inst._plan_epochs(args[0] if args else kwargs.get("n_epoch"))
                return fit(learner, *args, **kwargs)

            self._follow("fastai's epochs", learner_cls, fit=planned_fit)
        # fastai's own optimizers (its ``Adam``, ``SGD``...: no ``torch.optim.Optimizer``, so
        # none of torch's optimizer hooks): their step is the step's optimizer phase, and ends
        # the step, as torch's does (before, their time went to the next step's ``other``).
        found = _own_methods(sys.modules.get(_FASTAI_OPTIMIZER), "Optimizer", "step")
        if found is not None:
            opt_cls, (opt_step,) = found
            pre, post = self._opt_pre, self._opt_post

            @functools.wraps(opt_step)
            def step(optimizer: Any, /, *args: Any, **kwargs: Any) -> Any:
                pre(optimizer, args, kwargs)
                result = opt_step(optimizer, *args, **kwargs)
                post(optimizer, args, kwargs)
                return result

            self._follow("fastai's optimizers", opt_cls, step=step)

    def _fastai_validated(self, recorder: Any) -> None:
        """A fastai validation ended: its Recorder's validation metrics (none when it was
        cancelled, or the learner keeps none) as an evaluation, unless the script reports
        evaluations itself. Not a pass of ``get_preds`` (``tta``, an interpretation's): it
        validates on the data it is given, a test set's labelled batches say, and fastai
        gathers its predictions with a ``GatherPredsCallback`` among the learner's; after
        ``fit`` a test set's loss and accuracy were reported as the last epoch's."""
        if self.disabled or self.explicit_eval:
            return
        try:
            callbacks = getattr(getattr(recorder, "learn", None), "cbs", None) or ()
            if any(type(cb).__name__ == "GatherPredsCallback" for cb in callbacks):
                return  # ``get_preds``'s pass (predictions, on any data): no validation
            tensor = self.torch.Tensor
            numbers: dict[str, Any] = {}
            for metric in recorder._valid_mets:
                name, value = getattr(metric, "name", None), getattr(metric, "value", None)
                if isinstance(name, str) and name not in numbers and _logged_scalar(value, tensor):
                    numbers[name] = value
            self._metrics_eval(numbers)
        except Exception as exc:
            self._fail(exc)

    def _plan_epochs(self, epochs: Any) -> None:
        """A framework's planned epochs (Lightning's ``max_epochs``, the HF Trainer's
        ``num_train_epochs``, the ``max_epochs`` of the ignite engine whose run ends a
        training step, fastai's ``fit(n_epoch)``, SpeechBrain's epoch counter's ``limit``):
        announced with the rank, for the dashboard's progress and ETA where the run has none
        (``--epochs``, or the script's ``ddptui.started(epochs=…)`` before it). The first
        whole number from 1 to :data:`MAX_PLANNED_EPOCHS`, once: the dashboard keeps the
        first it gets, so a later one would say nothing."""
        if self.disabled or self._epochs_planned is not None or type(epochs) is not int:
            return
        if not 0 < epochs <= MAX_PLANNED_EPOCHS:
            return
        self._epochs_planned = epochs
        try:
            from ddptui.rank import reporter as reporter_module

            reporter_module.get_reporter().started(epochs=epochs)
        except Exception as exc:
            self._fail(exc)

    def _watch_speechbrain(self, torch: Any) -> None:
        """Follow SpeechBrain's brains from its import on, or now if it is loaded."""
        self._when_imported(_SPEECHBRAIN, self._attach_speechbrain)

    def _attach_speechbrain(self, module: Any = None) -> None:
        """SpeechBrain's validations: ``Brain.fit`` validates after each epoch's training
        (``Brain._fit_valid``: the modules in eval mode, no gradients, the batches' losses
        averaged), then hands that loss to the script's ``on_stage_end(Stage.VALID, loss,
        epoch)``, which logs it with its own metrics. The loss is reported as the epoch's
        evaluation: it is the whole validation set's on every rank, as SpeechBrain gives only
        the training set a DistributedSampler. ``on_stage_end`` is the script's override, so
        it is followed on the brain itself while its validation runs. Attached when
        ``speechbrain.core`` is imported."""
        found = self._unfollowed(
            "_speechbrain_attached", module, _SPEECHBRAIN, "Brain", "_fit_valid", "fit"
        )
        if found is None:
            return
        cls, (original, original_fit) = found
        inst = self

        @functools.wraps(original_fit)
        def fit(brain: Any, /, *args: Any, **kwargs: Any) -> Any:
            # Its plan: the epoch counter's limit (epochs counted from 1).
            counter = args[0] if args else kwargs.get("epoch_counter")
            inst._plan_epochs(getattr(counter, "limit", None))
            return original_fit(brain, *args, **kwargs)

        @functools.wraps(original)
        def _fit_valid(brain: Any, /, *args: Any, **kwargs: Any) -> Any:
            ended: list[tuple[Any, Any]] = []
            own = getattr(brain, "__dict__", None)
            if not isinstance(own, dict):  # no attributes of its own: not followed
                return original(brain, *args, **kwargs)
            kept = own.get("on_stage_end", _ABSENT)
            stage_end = brain.on_stage_end

            def on_stage_end(*a: Any, **kw: Any) -> Any:
                stage = a[0] if a else kw.get("stage")
                ended.append((stage, a[1] if len(a) > 1 else kw.get("stage_loss")))
                return stage_end(*a, **kw)

            own["on_stage_end"] = on_stage_end
            try:
                result = original(brain, *args, **kwargs)
            finally:
                if kept is _ABSENT:
                    own.pop("on_stage_end", None)
                else:
                    own["on_stage_end"] = kept
            inst._speechbrain_validated(ended)
            return result

        self._follow("SpeechBrain's validations", cls, _fit_valid=_fit_valid, fit=fit)

    def _speechbrain_validated(self, ended: list[tuple[Any, Any]]) -> None:
        """A SpeechBrain validation ended: the loss of its ``VALID`` stage, if it ran one
        (no validation set: none), as an evaluation, unless the script reports evaluations
        itself."""
        if self.disabled or self.explicit_eval:
            return
        try:
            losses = [loss for stage, loss in ended if getattr(stage, "name", None) == "VALID"]
            if len(losses) == 1 and _logged_scalar(losses[0], self.torch.Tensor):
                self._framework_eval(losses[0], None, {})
        except Exception as exc:
            self._fail(exc)

    def _watch_mmengine(self, torch: Any) -> None:
        """Follow MMEngine's runners from their import on, or now where loaded."""
        for name in _MMENGINE:
            self._when_imported(name, self._attach_mmengine)

    def _attach_mmengine(self, module: Any) -> None:
        """MMEngine's validations and plan (OpenMMLab's runner: mmpretrain, mmdet, mmseg
        train through it). Its ``MMDistributedDataParallel`` validates through the inner
        module (``val_step``), never a DDP forward: the pass was not seen, its time went to
        the next step and its metrics (``Epoch(val) [1][4/4] accuracy: 17.2000``, gathered
        and broadcast by its evaluator, the same on every rank) were not reported. Its
        runner calls every hook through ``call_hook(name, **kwargs)``, whatever the loop:
        ``before_val_epoch`` to ``after_val_epoch`` is an evaluation pass, ``after_val_epoch``
        carries its metrics, ``before_train`` has the train loop built (its ``max_epochs``,
        by epoch). A test loop's (``after_test_epoch``) is no evaluation of training."""
        class_name = _MMENGINE.get(str(getattr(module, "__name__", None)))
        found = self._module_unfollowed(module, class_name, "call_hook") if class_name else None
        if found is None:
            return
        cls, (original,) = found
        inst = self

        @functools.wraps(original)
        def call_hook(runner: Any, /, *args: Any, **kwargs: Any) -> Any:
            hook = args[0] if args else kwargs.get("fn_name")
            if hook == "after_val_epoch":
                inst._mmengine_validated(kwargs.get("metrics"))
            elif hook == "before_val_epoch":
                inst._eval_forward(True)
            elif hook == "before_train":
                inst._mmengine_plan(runner)
            return original(runner, *args, **kwargs)

        self._follow("MMEngine's validations", cls, call_hook=call_hook)

    def _mmengine_plan(self, runner: Any) -> None:
        """An MMEngine training begins: an epoch-based loop's ``max_epochs`` is the plan (an
        iteration-based one says 1 epoch for its hooks' sake: none)."""
        if self.disabled:
            return
        try:
            loops = sys.modules.get(_MMENGINE_LOOPS)
            by_epoch = getattr(loops, "EpochBasedTrainLoop", None)
            loop = getattr(runner, "_train_loop", None)
            if isinstance(by_epoch, type) and isinstance(loop, by_epoch):
                self._plan_epochs(loop.max_epochs)
        except Exception as exc:
            self._fail(exc)

    def _mmengine_validated(self, metrics: Any) -> None:
        """An MMEngine validation ended: its span is the evaluation pass (out of the next
        step's time), and its ``metrics`` (``accuracy``, ``accuracy/top1``: the loss and
        the accuracy :func:`_metric_named` finds, the other numbers as extras) the epoch's
        evaluation, unless the script reports evaluations itself."""
        if self.disabled:
            return
        try:
            self._eval_forward(False)
            self._evaluated = False  # reported here: no logger's numbers are another one
            if self.explicit_eval or not isinstance(metrics, dict):
                return
            tensor = self.torch.Tensor
            items = itertools.islice(metrics.items(), MAX_MMENGINE_METRICS)
            self._metrics_eval({str(k): v for k, v in items if _logged_scalar(v, tensor)})
        except Exception as exc:
            self._fail(exc)

    def _lightning_validated(self, outputs: Any) -> None:
        """A Lightning validation returned ``outputs`` (a dict of logged numbers per loader):
        the first loader's loss and accuracy (the names :func:`_metric_named` finds) as an
        evaluation, every other number as its extras; nothing unless one of the two is there,
        or when the script reports evaluations itself."""
        if self.disabled or self.explicit_eval or not isinstance(outputs, list | tuple):
            return
        try:
            tensor = self.torch.Tensor
            loaders = [
                {k: v for k, v in o.items() if _logged_scalar(v, tensor)}
                for o in outputs
                if isinstance(o, dict)
            ]
            first = loaders[0] if loaders else {}
            loss_name = _metric_named(first, LOSS_WORDS)
            accuracy_name = _metric_named(first, ACCURACY_WORDS)
            if loss_name is None and accuracy_name is None:
                return
            chosen = {loss_name, accuracy_name}
            extras = {str(k): v for loader in loaders for k, v in loader.items() if k not in chosen}
            self._framework_eval(
                first.get(loss_name) if loss_name is not None else None,
                first.get(accuracy_name) if accuracy_name is not None else None,
                extras,
            )
        except Exception as exc:
            self._fail(exc)

    def _framework_eval(
        self, loss: Any, accuracy: Any, extras: dict[str, Any], epoch: Any = _NOW
    ) -> None:
        """Report a framework's evaluation of the epoch training is in (or ``epoch``): its
        loss, accuracy and the first :data:`HF_EXTRA_METRICS` of its other numbers (none
        named as one of ``log_eval``'s own arguments). A SummaryWriter's numbers kept for the
        same pass are not another evaluation."""
        self._tensorboard_numbers = None
        kept = (item for item in extras.items() if item[0] not in _EVAL_FIELDS)
        from ddptui.rank import reporter as reporter_module

        reporter_module.get_reporter().log_eval(
            epoch=self._epoch if epoch is _NOW else epoch,
            loss=loss,
            accuracy=accuracy,
            **dict(itertools.islice(kept, HF_EXTRA_METRICS)),
        )

    def _trainer_evaluated(self, metrics: Any, prefix: Any, datasets: Iterable[Any] = ()) -> None:
        """``Trainer.evaluate`` returned ``metrics``: its ``{prefix}_loss`` and
        ``{prefix}_accuracy`` as an evaluation (with its other numbers as extras), unless the
        script reports evaluations itself or neither is there. With several evaluation
        datasets (``datasets``, the names of ``eval_dataset`` a dict: HF names their metrics
        ``{prefix}_{name}_loss``), the first one's are the evaluation and the others' loss and
        accuracy come first among the extras (``{name}_loss``)."""
        if self.disabled or self.explicit_eval or not isinstance(metrics, dict):
            return
        if not isinstance(prefix, str):
            return
        try:
            named = {
                str(k)[len(prefix) + 1 :]: _plain_number(v)
                for k, v in metrics.items()
                if str(k).startswith(prefix + "_") and _plain_number(v) is not None
            }
            names = [str(name) for name in itertools.islice(datasets, HF_EXTRA_METRICS + 1)]
            first, *others = names or [""]
            head = f"{first}_" if first else ""
            loss, accuracy = named.pop(f"{head}loss", None), named.pop(f"{head}accuracy", None)
            if loss is None and accuracy is None:
                return
            scores = [f"{name}_{what}" for name in others for what in ("loss", "accuracy")]
            extras = {k: named.pop(k) for k in scores if k in named}
            self._framework_eval(loss, accuracy, {**extras, **named})
        except Exception as exc:
            self._fail(exc)

    def _passes_noted(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        inst = self

        @functools.wraps(original)
        def __iter__(loader: Any, /) -> Any:
            batches = iter(original(loader))
            try:
                for batch in batches:
                    epoch = getattr(loader, "iteration", None)
                    if type(epoch) is int and epoch >= 0:
                        inst._loader_epoch = epoch
                    yield batch
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()

        return __iter__

    def _sampler_entry(self, sampler: Any) -> _SamplerPasses | None:
        """The pass record of ``sampler`` (made on first sight), or None when it cannot be
        followed (not weakly referable, or too many samplers alive)."""
        key = id(sampler)
        entry = self._samplers.get(key)
        if entry is not None and entry.ref() is sampler:
            return entry
        if len(self._samplers) >= MAX_SAMPLERS:
            return None
        samplers = self._samplers
        try:
            ref = weakref.ref(sampler, lambda _, key=key: samplers.pop(key, None))
        except TypeError:
            return None
        entry = samplers[key] = _SamplerPasses(ref)
        return entry

    def _sampler_told(self, sampler: Any) -> None:
        """``set_epoch`` was called on ``sampler``: it is never judged."""
        try:
            entry = self._sampler_entry(sampler)
            if entry is not None:
                entry.told = True
        except Exception as exc:
            self._fail(exc)

    def _sampler_pass(self, sampler: Any) -> None:
        """``sampler`` starts a pass: note a shuffling one never told its epoch that starts
        another pass at the epoch of its previous one (once per process), once it has fed a
        training step. A sampler whose passes feed none (an evaluation loop, which may well
        run with grad enabled and only its forwards without) shuffles harmlessly."""
        self._last_pass = None  # another pass started since: the last one fed no step
        try:
            # The script's own sampler (a subclass) may fail here: not ours to judge; its own
            # __iter__ will meet the same attribute.
            shuffle, epoch = sampler.shuffle, sampler.epoch
            if type(shuffle) not in (bool, int) or not shuffle or type(epoch) is not int:
                return
        except Exception:
            return
        try:
            entry = self._sampler_entry(sampler)
            if entry is None:
                return
            previous, entry.epoch = entry.epoch, epoch
            entry.passes += 1
            self._last_pass = entry
            if entry.told or not entry.trained or previous != epoch:
                return
            self._sampler_noted = True
            self._samplers.clear()  # nothing more to follow
            self._last_pass = None
            self._send_note(epoch, entry.passes)
        except Exception as exc:
            self._fail(exc)

    def _send_note(self, epoch: int, passes: int) -> None:
        # first use of the protocol in some ranks: imported here to keep the rank light
        from ddptui import protocol
        from ddptui.rank import reporter as reporter_module

        top = protocol.MAX_NOTE_NUMBER
        reporter_module.get_reporter().note(
            "sampler_epoch",
            epoch=epoch if 0 <= epoch <= top else None,
            passes=min(passes, top),
        )

    def _attach_collectives(self, torch: Any) -> None:
        """Time the collectives a script calls itself (a ``barrier``, metric ``all_reduce``s
        between forward and backward): their time is ``comm``, taken out of the phase they
        were called in. Host time, so CPU ranks only (on GPU a collective's call returns
        before the device has done it)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name in (*COLLECTIVES, *(n for n in P2P if n not in COLLECTIVES)):
            original = c10d.__dict__.get(name)
            if original is None or not callable(original):
                continue
            wrapper = self._collective_wrapper(original) if name in COLLECTIVES else original
            if name in P2P:
                wrapper = self._p2p_wrapper(wrapper)
            self._patch(c10d, name, wrapper)
            if dist.__dict__.get(name) is original:
                self._patch(dist, name, wrapper)
        work = getattr(c10d, "Work", None)
        wait = getattr(work, "__dict__", {}).get("wait")
        if wait is not None and callable(wait):
            self._follow("an async collective's wait", work, wait=self._wait_wrapper(wait))

    def _untimed(self) -> bool:
        """Whether a collective (or an async one's wait) called now goes untimed: inside
        another, with the hooks off, on a GPU rank, or from a thread other than the step's."""
        return (
            self._in_collective
            or self.disabled
            or self._cuda is not None
            or (self._step_thread is not None and get_ident() != self._step_thread)
        )

    def _wait_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Work.wait`` as the script calls it on an async collective's work (``work =
        dist.all_reduce(t, async_op=True)`` … ``work.wait()``; facebookresearch/pycls all-reduces
        its loss and errors so): a frame of ddptui's on the rank's stack while it waits, which
        says it waits in a collective (:data:`ddptui.rank.frames.ASYNC_WAIT`), and the wait's
        time ``comm``, as a collective's call is. The wait is C++ beneath the script's own
        line: a rank blocked there read "hung outside any collective", beside its peer that
        never entered the all-reduce, both called hung on their own."""
        inst = self

        def async_collective_wait(work: Any, /, *args: Any, **kwargs: Any) -> Any:
            if inst._untimed():
                return original(work, *args, **kwargs)
            start = inst.clock()
            try:
                return original(work, *args, **kwargs)
            finally:
                inst._collective_time(start)

        async_collective_wait.__doc__ = original.__doc__
        return async_collective_wait

    def _attach_spawn(self, torch: Any) -> None:
        """Workers the script spawns with ``torch.multiprocessing`` are instrumented too, and
        this process, which only waits for them from then on, goes quiet (ddptui.rank.spawned);
        so are the workers it starts with ``multiprocessing.Process``, and it goes quiet once
        one of them has formed a process group."""
        import torch.multiprocessing as tmp

        spawn_module = sys.modules["torch.multiprocessing.spawn"]
        original = spawn_module.start_processes

        @functools.wraps(original)
        def start_processes(fn: Any, *args: Any, **kwargs: Any) -> Any:
            target = spawned.wrap_target(fn, install)
            if target is not fn:
                # start_processes(fn, args=(), nprocs=1, ...): mp.spawn passes it by position
                nprocs = kwargs.get("nprocs", args[1] if len(args) > 1 else 1)
                spawned.became_spawner(nprocs)
                spawned.share_threads(nprocs)
            return original(target, *args, **kwargs)

        self._patch(spawn_module, "start_processes", start_processes)
        if tmp.__dict__.get("start_processes") is original:
            self._patch(tmp, "start_processes", start_processes)

        # Workers started with multiprocessing.Process (torch.multiprocessing.Process is it)
        # by the script: see spawned.wrap_process.
        import multiprocessing.process  # loaded by torch.multiprocessing

        process_class = multiprocessing.process.BaseProcess
        start = process_class.start

        @functools.wraps(start)
        def start_process(process: Any, /) -> None:
            if not self.disabled:
                try:
                    spawned.wrap_process(process, install)
                except Exception as exc:  # it starts as the script made it, unseen; steps go on
                    _warn(f"instrumentation: a process the script started is not followed ({exc})")
            return start(process)

        self._patch(process_class, "start", start_process)

    def _attach_process_group(self, torch: Any) -> None:
        """Learn this process's rank from the process group it creates (a worker the script
        spawned knows it only then; so does a script that passes its own rank)."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original = c10d.init_process_group

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            spawned.before_rendezvous()
            result = original(*args, **kwargs)
            try:
                spawned.on_process_group(dist.get_rank(), dist.get_world_size())
            except Exception:  # telemetry never changes how a rank runs
                pass
            return result

        self._patch(c10d, "init_process_group", init_process_group)
        if dist.__dict__.get("init_process_group") is original:
            self._patch(dist, "init_process_group", init_process_group)

    def _collective_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        inst = self

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if inst._untimed():
                return original(*args, **kwargs)
            inst._in_collective = True
            start = inst.clock()
            try:
                return original(*args, **kwargs)
            finally:
                inst._in_collective = False
                inst._collective_time(start)

        return collective

    def _p2p_wrapper(self, call: Callable[..., Any]) -> Callable[..., Any]:
        inst = self

        @functools.wraps(call)
        def p2p(*args: Any, **kwargs: Any) -> Any:
            if not inst._p2p_noted:
                inst._note_p2p()
            return call(*args, **kwargs)

        return p2p

    def _note_p2p(self) -> None:
        """The first point-to-point op of this process: said once (``p2p``)."""
        self._p2p_noted = True
        if self.disabled:
            return
        try:
            from ddptui.rank import reporter as reporter_module

            reporter_module.get_reporter().note("p2p")
        except Exception as exc:
            self._fail(exc)

    def _collective_time(self, start: float) -> None:
        """A collective called from Python took ``start`` → now: count it as ``comm`` and out
        of the segment it interrupted (its start moves forward by as much)."""
        if self._mark is None:
            return  # before the first step: nothing is being timed
        spent = max(0.0, self.clock() - max(start, self._mark))
        self._acc["comm"] += spent
        self._mark += spent
        if self._eval_start is not None and self._eval_end is None:
            self._eval_start += spent  # an evaluation's metric all_reduce: comm, not eval

    def watch(self, ddp: Any) -> None:
        """Hook one ``DistributedDataParallel`` module (done for every DDP module created once
        the hooks are installed; call it for one created before)."""
        if self.disabled:
            return
        if self._rank_unknown:  # DDP needs the group: a spawned worker's rank is known now
            self._rank_unknown = not spawned.learn_rank()
        self._attach_frameworks()
        try:
            inner = ddp.module
            group = getattr(ddp, "process_group", None)
            if group is not None and hasattr(group, "size"):
                self._data_parallel(int(group.size()))
            outer_post = ddp.register_forward_hook(_ModuleHook(self._outer_post))
            outer_pre = ddp.register_forward_pre_hook(
                _ModuleHook(self._outer_pre), with_kwargs=True
            )
            self._handles += [
                outer_pre,
                outer_post,
                inner.register_forward_pre_hook(_ModuleHook(self._inner_pre), with_kwargs=True),
                inner.register_forward_hook(_ModuleHook(self._inner_post)),
            ]
            self._forget_gone()
            key, inner_key = id(ddp), id(inner)
            self._outer_posts[key] = outer_post
            self._outer_pres[key] = outer_pre
            self._inner_owner[inner_key] = weakref.ref(ddp)
            self._models = [ref for ref in self._models if ref() is not None]
            self._models.append(weakref.ref(ddp, self._on_gone(key, inner_key)))
            param = next(iter(inner.parameters()), None)
            if param is not None and param.device.type == "cuda":
                self._cuda = param.device
        except Exception as exc:
            self._fail(exc)

    def _on_gone(self, key: int, inner_key: int) -> Callable[[Any], None]:
        """The callback for when the DDP module ``key`` (its inner module ``inner_key``) is
        gone: its gradient watch lets go of its parameters at once (it kept every model a
        script made, a fold after a fold, alive to the end), and the rest it left, kept by
        those ids, goes at the next :meth:`watch` (a callback may run in any thread, at any
        allocation: it changes no dict another loop may be going over)."""

        def gone(_: Any) -> None:
            watch = self._watches.get(key)
            if watch is not None:
                watch.release()
            self._gone.append((key, inner_key))

        return gone

    def _forget_gone(self) -> None:
        """What was kept by the id of a DDP module now gone goes: CPython gives a new object
        the address of one freed, and a new DDP module took a dead one's watch (the dead
        one's parameters' hooks: its own gradients never seen) and its hooks' records."""
        gone = self._gone
        while gone:
            key, inner_key = gone.pop()
            self._watches.pop(key, None)
            self._outer_posts.pop(key, None)
            self._outer_pres.pop(key, None)
            self._active.discard(key)
            self._eval_trainers.discard(key)
            self._direct_checked.discard(inner_key)
            owner = self._inner_owner.get(inner_key)
            if owner is not None and owner() is None:
                del self._inner_owner[inner_key]
            if self._fwd_ddp == key:
                self._fwd_ddp = None

    def holds_ddp(self) -> bool:
        """Whether a DDP module these hooks watch is alive (the heartbeat's question: without
        one, a rank in ``backward()`` computes, waiting for no gradient all-reduce). Safe
        from any thread (a list, iterated while the main thread may add to it)."""
        return any(ref() is not None for ref in self._models)

    def _fail(self, exc: BaseException) -> None:
        if not self.disabled:
            self.disabled = True
            _warn(f"instrumentation off after an internal error: {type(exc).__name__}: {exc}")
            # and to the run, where the steps stop: the rank's log alone went unread (a run
            # of stylegan2-ada-pytorch showed 1 step of 32, and finished as if that were all)
            with contextlib.suppress(Exception):
                from ddptui.rank import reporter as reporter_module

                reporter_module.get_reporter().note("instrument_off")

    # -- the step's timeline -------------------------------------------------------------------
    def _event(self) -> Any:
        """A CUDA event recorded now on the DDP device's current stream (GPU mode)."""
        cuda = self.torch.cuda
        event = cuda.Event(enable_timing=True)
        event.record(cuda.current_stream(self._cuda))
        return event

    def _transition(self, nxt: str, new_seg: str, at: float | None = None) -> float:
        """Close the current segment at ``nxt`` (an event name) and open ``new_seg``; returns
        the time of the transition: now, or ``at`` (no later than now, no earlier than the
        segment's start; an evaluation since is the next segment's)."""
        now = self.clock() if at is None else at
        if self._cuda is not None:
            return self._transition_cuda(now, nxt, new_seg, at is None)
        mark = self._mark
        closed = "data"  # the phase the segment's time went to (an evaluation in it: out)
        if mark is not None:
            seg = self._seg
            t_grad = self._t_grad
            if t_grad is not None and seg in _BWD and mark <= t_grad <= now:
                acc = self._acc
                acc["backward"] += t_grad - mark
                acc[_AFTER_GRAD[nxt]] += now - t_grad
            else:
                closed = _RESOLVE[seg, nxt]
                self._acc[closed] += now - mark
        if self._eval_end is not None and at is None:
            self._take_eval(closed)
        self._seg, self._mark = new_seg, now
        self._t_grad = None
        return now

    def _transition_cuda(self, now: float, nxt: str, new_seg: str, evals: bool = True) -> float:
        """:meth:`_transition` on GPU: the host accounting, and a CUDA event per segment."""
        seg, mark = self._seg, self._mark
        event = self._event()
        if mark is not None:
            t_grad = self._t_grad
            if seg in _BWD and t_grad is not None and mark <= t_grad <= now:
                rest = _AFTER_GRAD[nxt]
                self._acc["backward"] += t_grad - mark
                self._acc[rest] += now - t_grad
                self._marks.append(("backward", self._grad_event))
                self._marks.append((rest, event))
            else:
                name = _RESOLVE.get((seg, nxt)) or _resolve(seg, nxt)
                self._acc[name] += now - mark
                self._marks.append((name, event))
        else:
            self._marks = [("start", event)]
        if self._eval_end is not None and evals:
            self._take_eval()
        self._seg, self._mark = new_seg, now
        self._t_grad = None
        if new_seg in _BWD:
            self._grad_event = self.torch.cuda.Event(enable_timing=True)
        return now

    def _take_eval(self, closed: str = "data") -> None:
        """The evaluation pass that ran in the segment just closed (first evaluation forward
        to the last one's end, its data loading between them included) is ``eval``, out of
        the time of the phase that segment went to (CPU: ``data`` before a DDP forward; the
        whole step up to its backward, ``other``, where no DDP forward marks one; GPU phases
        are device time, where the pass shows as the device's own work), and out of the
        step's time on both: evaluating is not training, and a step's rate is its samples
        over its training time (as ``ddptui.log_eval`` starts the next step's interval for an
        explicit log)."""
        start, end = self._eval_start, self._eval_end
        self._eval_start = self._eval_end = None
        if start is None or end is None:
            return
        spent = max(0.0, end - start)
        if self._cuda is None:
            spent = min(spent, self._acc[closed])
            self._acc[closed] -= spent
            self._acc["eval"] += spent
        self._eval_spent += spent

    def _eval_forward(self, start: bool, trains: bool = False, counted: bool = True) -> None:
        """An evaluation forward of a DDP module begins (``start``) or ends; ``trains``: the
        module's mode says it trains, only grad is off; ``counted``: one of
        :attr:`evaluations` (not the inner module's, whose DDP module's forward counted).

        Such a forward after the step drew its training batch, with no evaluation begun, is
        the step's own: a target or teacher network run under ``torch.no_grad()`` on the
        step's batch (facebookresearch/ijepa's target encoder, a DDP module in training mode,
        before its context encoder and predictor train). Its time is the step's forward,
        where it had been taken out of the step as an evaluation (a third of ijepa's step
        time read ``eval``, and the step's rate was over the rest)."""
        if start:
            self._fwd_calls += 1
        if self._mark is None:
            if start and counted:  # before the first step: an evaluation all the same
                self.evaluations += 1
            return  # before the first training step: not part of any step
        if self._seg == "forward" and not self._training_fwd:
            return  # in (or after) the step's own forward with grad off
        if (
            start
            and trains
            and self._seg == "data"
            and self._step_wait is not None
            and self._eval_start is None
        ):
            self._transition("fwd_pre", "forward")
            return
        now = self.clock()
        if start:
            if counted:
                self.evaluations += 1
            if self._eval_start is None:  # the pass's first forward
                self._eval_start = now
        else:
            self._evaluated = True
            if self._eval_start is not None:
                self._eval_end = now

    def _forward_start(self, args: tuple, kwargs: dict, new_seg: str) -> None:
        self._eval_grad = self._mode_draw = None  # a training forward came first
        if self._eval_end is None:
            self._eval_start = None  # batches drawn for an evaluation no forward made
        if self._closure_now:
            # The closure evaluated again inside the same optimizer step (LBFGS's line
            # search, up to max_iter times a step): the same batch, not another one, and the
            # step's loss is its first evaluation's (the one ``step`` returns). The time
            # since the last evaluation's ``backward()`` is the optimizer's own work.
            self._closure_repeat = True
            if self._seg == "after_bwd":
                self._seg = "optimizer"
        elif self._seg == "optimizer" and self._mark is not None:
            # A forward inside the optimizer step: a closure. Its time so far (the
            # framework's prelude: zero_grad, callbacks) is before the forward, as ``data``.
            self._closure_now = True
            self._seg = "closure"
        self._opt_depth = 0
        self._ddp_seen = True
        self._fwd_calls += 1
        self._fwd_seen = True
        if self._tensorboard_numbers is not None:
            self._tensorboard_eval()  # before the epoch below moves on
        self._evaluated = False  # a metric computed from here on is the training's
        if self._loader_epoch is not None:  # an accelerate loader's pass (_attach_accelerate)
            self._epoch = self._loader_epoch
        first = self._mark is None
        now = self._transition("fwd_pre", new_seg)
        if first:
            self._step_start = now
        if not self._closure_repeat:
            samples = _forward_samples(self.torch.Tensor, args, kwargs, self._outputs)
            if samples:
                self._add_samples(self._fwd_ddp, samples)
        if self._batch_digest is not None:  # once a run
            self._note_trained_batch(args, kwargs)
        if not self._first_released and self._pending:
            self._release_first()

    def _eval_draw(self) -> bool:
        """Whether a batch drawn now is an evaluation's: grad is off, or every DDP module
        watched is in eval mode (a script that evaluates after ``model.eval()`` without
        ``torch.no_grad()``; a module in eval mode inside a DDP wrapper in train mode, or the
        reverse as Lightning leaves it, trains). Before any DDP module, grad alone says."""
        if not self._grad_enabled():
            return True
        alive = False
        for ref in self._models:  # training: the first module says so (no list, no generator)
            model = ref()
            if model is not None:
                if self._trains_in_mode(model):
                    return False
                alive = True
        return alive

    def _training(self, module: Any) -> bool:
        return module.training and self._grad_enabled()

    def _trains_in_mode(self, ddp: Any) -> bool:
        """Whether a DDP module's mode says it trains: it or the module it wraps is in
        training mode (PyTorch Lightning leaves its DDP wrapper in eval mode after the sanity
        check and switches only the LightningModule inside back to ``train()``), or it trains
        in eval mode (:meth:`_trained_in_eval`)."""
        return (
            ddp.training or getattr(ddp.module, "training", False) or id(ddp) in self._eval_trainers
        )

    def _training_ddp(self, ddp: Any) -> bool:
        """A DDP module's forward trains when grad is on and its mode says it trains."""
        return self._trains_in_mode(ddp) and self._grad_enabled()

    # -- hooks ---------------------------------------------------------------------------------
    def _outer_pre(self, ddp: Any, args: tuple, kwargs: dict) -> None:
        self.hook_calls += 1
        if self.disabled or self._tracing():
            return None
        try:
            if not self._training_ddp(ddp):
                if self._grad_enabled():  # eval mode, grad on: a backward may follow
                    self._note_eval_grad(ddp, args, kwargs)
                self._eval_forward(True, self._trains_in_mode(ddp))
                return None
            self._training_fwd = True
            key = self._fwd_ddp = id(ddp)
            watch = self._watches.get(key)
            if watch is None:
                self._watches[key] = _GradWatch(self, list(ddp.module.parameters()))
            elif watch.thawing:
                watch.arm_thawed()
            if self._seg == "after_bwd" and not self._opt_seen and self._grads_discarded():
                self._end_without_optimizer()
            self._active.add(key)
            self._forward_start(args, kwargs, "ddp_pre")
        except Exception as exc:
            self._fail(exc)
        return None

    def _inner_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.hook_calls += 1
        if self.disabled:
            return None
        try:
            if self._training_fwd:
                if self._seg == "ddp_pre":
                    self._transition("inner_pre", "forward")
            elif self._tracing():
                pass  # torch.jit.trace(model.module, x): no forward of the run's
            elif self._training(module):
                if id(module) not in self._direct_checked:
                    self._check_direct(module)
                self._training_fwd = True  # the inner module called without DDP
                self._fwd_ddp = None
                self._forward_start(args, kwargs, "forward")
            else:  # ``model.module(x)`` to evaluate, or inside a DDP module's evaluation
                self._eval_forward(True, module.training, counted=False)
        except Exception as exc:
            self._fail(exc)
        return None

    def _check_direct(self, inner: Any) -> None:
        """The inner module of a watched DDP module trains with no DDP forward begun: once
        per inner module, whether DDP's ``forward`` called it all the same, the script having
        called ``model.forward(x, y)`` itself (facebookresearch/vicreg, barlowtwins), which
        runs no module hook of DDP's. Then DDP's pre-forward work (its buffers' broadcast,
        where a rank waits for a slower one) had no start: it read as ``other``, and a rank
        asleep before its forward was no straggler. From here on that module's forwards are
        timed by ddptui's ``DistributedDataParallel.forward`` in place of its hooks, whichever
        way the script calls it; this first one stays as it was read."""
        self._direct_checked.add(id(inner))
        ref = self._inner_owner.get(id(inner))
        ddp = ref() if ref is not None else None
        original = self._ddp_forward
        if ddp is None or original is None or getattr(ddp, "module", None) is not inner:
            return
        frame = sys._getframe(2)
        for _ in range(12):  # the hook, torch's call of it, DDP's forward: a few frames up
            if frame is None:
                return
            if frame.f_code is original.__code__:
                break
            frame = frame.f_back
        else:
            return
        for hooks in (self._outer_pres, self._outer_posts):
            handle = hooks.pop(id(ddp), None)
            if handle is not None:
                handle.remove()
        if not self._direct_patched():
            self._patch_ddp_forward()
        self._direct.add(ddp)

    def _direct_patched(self) -> bool:
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP.__dict__.get("forward") is not self._ddp_forward

    def _patch_ddp_forward(self) -> None:
        """``DistributedDataParallel.forward`` runs ddptui's DDP hooks for the modules of
        :attr:`_direct` (and only calls torch's for any other)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        original, direct = self._ddp_forward, self._direct
        pre, post = self._outer_pre, self._outer_post

        @functools.wraps(original)
        def forward(ddp: Any, /, *args: Any, **kwargs: Any) -> Any:
            if ddp not in direct:
                return original(ddp, *args, **kwargs)
            pre(ddp, args, kwargs)
            output = original(ddp, *args, **kwargs)
            post(ddp, args, output)
            return output

        self._patch(DDP, "forward", forward)

    def _inner_post(self, module: Any, args: tuple, output: Any) -> None:
        self.hook_calls += 1
        if self.disabled:
            return None
        if not self._training_fwd:
            if not self._training(module) and not self._tracing():
                self._eval_forward(start=False)
            return None
        try:
            self._transition("fwd_post", "bwd")
            self._output_seen(output)
            self._training_fwd = False  # the rest of a DDP forward runs no inner hook
            if self._outer_posts and self._fwd_ddp is not None and not _wraps_output(module, self):
                # The inner hooks see this DDP module's forwards: its own post hook (one
                # call per step) is not needed any more.
                handle = self._outer_posts.pop(self._fwd_ddp, None)
                if handle is not None:
                    handle.remove()
        except Exception as exc:
            self._fail(exc)
        return None

    def _outer_post(self, ddp: Any, args: tuple, output: Any) -> None:
        self.hook_calls += 1
        if self.disabled:
            return None
        if not self._training_fwd:
            if not self._training_ddp(ddp):
                if not self._tracing():
                    self._eval_forward(start=False)
            elif not self.disabled:  # the output DDP made of its module's (_wraps_output)
                self._output_seen(output)
            return None
        try:
            if self._seg == "ddp_pre":  # DDP ran the inner forward without calling it
                self._transition("fwd_post", "bwd")
            self._output_seen(output)
            self._training_fwd = False
            self._fwd_ddp = None
        except Exception as exc:
            self._fail(exc)
        return None

    def _output_seen(self, output: Any) -> None:
        """A training forward returned ``output``: kept (weakly, a few a step) for
        :func:`_forward_samples`."""
        if len(self._outputs) < MAX_STEP_OUTPUTS and isinstance(output, self.torch.Tensor):
            self._outputs.append(weakref.ref(output))

    def _record_grad_event(self) -> None:
        """GPU: the last-gradient event, behind the kernel that made the gradient."""
        if self._grad_event is not None:
            try:
                self._grad_event.record(self.torch.cuda.current_stream(self._cuda))
            except Exception as exc:
                self._fail(exc)

    def _on_scale(self, outputs: Any, scaled: Any) -> None:
        if self.disabled:
            return
        torch = self.torch
        if isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
            # by a weak reference: a scaled loss dropped unused leaves its address to the
            # next tensor made, maybe the loss backwarded next (read as the dropped one's)
            ref = _weak(scaled)
            self._scaled = (ref, outputs.detach(), _divisor(outputs)) if ref is not None else None

    def _backward_call(self, tensor: Any) -> None:
        self.hook_calls += 1
        self._backwards += 1
        self._grad_calls += 1
        self._opt_depth = 0
        if self.disabled:
            return
        if self._seg not in _BWD and (self._ddp_seen or tensor.device.type not in _LOSS_DEVICES):
            # Outside a DDP step's backward: not the loss. Without any DDP module (FSDP, a
            # plain model, timm's train.py in one process) no forward is seen, and a 0-dim
            # tensor's backward is the loss all the same: on the CPU, or on a GPU (copied to
            # the host at the step's end and read once the device has passed the copy).
            return
        if self._closure_repeat:
            return  # the loss of a repeated closure evaluation: not the step's
        try:
            if tensor.dim() == 0:
                self._loss_count += 1
                scaled = self._scaled
                if scaled is not None and scaled[0]() is tensor:
                    self._keep_loss(scaled[1], scaled[2])
                elif (
                    tensor.is_cpu
                    and type(tensor) is self.torch.Tensor
                    and tensor.is_floating_point()  # (a complex one is read as it was)
                ):
                    # A CPU's loss is read now, as its backward begins: one tensor call here
                    # (torch's dispatch just ran for the loss itself), where a detach here
                    # and a read at the step's end were two, the second after the optimizer's
                    # kernels had pushed torch's code out of the caches (5.5 us of a 3 ms
                    # SmallCNN step). A script's own in-place all-reduce of its loss after the
                    # step (facebookresearch/pycls's ``scaled_all_reduce``) comes later still:
                    # the rank's own loss is read. The divisor is read from the graph.
                    self._keep_loss(float(tensor.item()), self._divisor_of(tensor))
                else:
                    # Detached: the loss is read at the step's end (a GPU's copied then, read
                    # by the drainer), and the tensor itself would keep the step's whole
                    # autograd graph alive until then. Keeping 16 such losses, with no hooks
                    # at all, cost 30 to 570 us of a 3 ms SmallCNN step on CPU (five
                    # processes, three of them 67-85 us); detached ones, nothing measurable.
                    # The divisor is read now, from the graph, while it is there.
                    self._keep_loss(tensor.detach(), self._divisor_of(tensor))
            self._scaled = None
        except Exception as exc:
            self._fail(exc)

    def _divisor_of(self, loss: Any) -> float | str | None:
        """:func:`_divisor` of the step's loss just counted; UNREAD for a step's first while
        no step of the run has had more than one (they are read from the second on: the
        first step that accumulates takes its first micro-batch's as its others')."""
        if self._loss_count > 1 or self._several_losses:
            return _divisor(loss)
        return UNREAD

    def _keep_loss(self, loss: Any, divisor: float | str | None) -> None:
        """One micro-batch's loss into the step's (see :data:`MAX_LOSSES`), and what it was
        divided by: each divisor once, as only whether all of them are the accumulation's
        count is asked (``_finish_step``); past MAX_LOSSES distinct ones they cannot be."""
        losses = self._losses
        if len(losses) >= MAX_LOSSES:
            torch = self.torch
            try:
                if all(type(value) is float for value in losses):  # read already (the CPU's)
                    total = math.fsum(losses)
                else:
                    stacked = torch.stack(losses)
                    total = stacked.sum(dtype=torch.promote_types(stacked.dtype, torch.float32))
            except Exception:
                # losses on two devices, or read and not: the first MAX_LOSSES stand for the
                # step
                total = None
            if total is None:
                return
            self._folded += len(losses) - 1
            losses[:] = [total]
        losses.append(loss)
        divisors = self._loss_divisors
        if len(divisors) <= MAX_LOSSES and divisor not in divisors:
            divisors.append(divisor)

    def _note_eval_grad(self, ddp: Any, args: tuple, kwargs: dict) -> None:
        key = id(ddp)
        watch = self._watches.get(key)
        if watch is None:
            watch = self._watches[key] = _GradWatch(self, list(ddp.module.parameters()))
        draw = self._mode_draw
        began = self._mark is not None and (
            self._eval_start is None or (draw is not None and self._eval_start == draw[2])
        )
        samples = _batch_size(self.torch.Tensor, args, kwargs)
        self._eval_grad = (key, watch, watch.fired, samples, began)

    def _trained_in_eval(self) -> None:
        """After a backward: the DDP module last run in eval mode with grad on got gradients
        from it. It trains in eval mode: its forwards are training forwards from now on, and
        this one's batch is the step's (its phases, seen as an evaluation's, are not)."""
        key, watch, fired, samples, began = self._eval_grad  # type: ignore[misc]
        self._eval_grad = None
        if watch.fired <= fired:
            return
        self._eval_trainers.add(key)
        if began:  # the evaluation span it (or its batch's draw) opened was this step's
            self._eval_start = self._eval_end = None
        draw, self._mode_draw = self._mode_draw, None
        it = draw[0]() if draw is not None else None
        if it is None:
            draw = None
        else:  # its batch: a training pass's (the epoch's, its length)
            self._training_draw(it, *draw[1:])
        if self._ddp_seen:
            self._add_samples(key, samples)
        elif draw is None:  # no training forward seen yet: the samples are the draws'
            self._loader_samples += samples

    def _add_samples(self, module: int | None, samples: int) -> None:
        """A training forward of DDP module ``module`` (its id; None: a module DDP wraps,
        called without it) took ``samples``: the step's are the most any one module took
        over its forwards (several micro-batches add up). Modules in series see the same
        samples: facebookresearch/dlrm's bottom and top MLPs, two DDP modules fed the rank's
        slice of 128 of a batch of 256 (the top one its interaction's output, not the bottom
        one's), counted 256 a step."""
        taken = self._module_samples
        total = taken.get(module, 0) + samples
        taken[module] = total
        if total > self._samples:
            self._samples = total

    def _backward_return(self) -> None:
        if self._eval_grad is not None and not self.disabled:
            try:
                self._trained_in_eval()
            except Exception as exc:
                self._fail(exc)
        if self.disabled or self._seg not in _BWD:
            return
        try:
            self._transition("bwd_return", "after_bwd")
            if not self._opt_seen:
                self._grad_left = self._a_gradient()
        except Exception as exc:
            self._fail(exc)

    # -- steps without an optimizer -----------------------------------------------------------
    # A DDP script may train without torch.optim: a throughput benchmark that runs forward
    # and backward only (kyoungseoun-chung/pytorch-distributed-cpu: zero_grad, forward,
    # backward, 500 times, no step), or one that updates its weights by hand. No optimizer
    # step ends its steps, and the run read "preparing" to its end. There, a training
    # forward that finds the last backward's gradients gone (set to None, replaced or
    # zeroed in place: consumed), or the weights they were for updated in place (``with
    # torch.no_grad(): p -= lr * p.grad``, where the loop zeroes its gradients only after
    # the next forward: forward, ``model.zero_grad()``, backward, update), ends the step of
    # that backward, at the backward's return. Gradient accumulation leaves both as they were
    # until its optimizer step (nanoGPT's micro-steps, a loop dividing its loss by the
    # window): no step ends there. An update through ``p.data`` bumps no version: a loop
    # that does it and zeroes after its forward still reads no step.
    def _a_gradient(self) -> tuple[Any, Any, int, int] | None:
        """A parameter of this step's DDP modules that got a gradient, the gradient (weakly:
        it must go when the script lets it), its version and the parameter's; None without
        one."""
        for key in self._active:
            watch = self._watches.get(key)
            if watch is None or watch.last is None or watch.last >= len(watch.params):
                continue  # (or a released watch: its module is gone)
            param = watch.params[watch.last]
            grad = param.grad
            if grad is not None:
                return param, weakref.ref(grad), grad._version, param._version
        return None

    def _grads_discarded(self) -> bool:
        """Whether the gradient noted at the last training backward's return is no longer
        its parameter's as it was (set to None, replaced, or changed in place: zeroed), or the
        parameter was updated in place since."""
        left = self._grad_left
        if left is None:
            return False
        param, ref, version, weights = left
        grad = param.grad
        return (
            grad is None
            or grad is not ref()
            or grad._version != version
            or param._version != weights
        )

    def _end_without_optimizer(self) -> None:
        """End the step whose gradients were consumed without an optimizer step, at its
        backward's return (what came after, the next batch's wait, is the next step's)."""
        self._grad_left = None
        if self._rank_unknown:
            self._rank_unknown = not spawned.learn_rank()
        self._finish_step(0, at=self._mark)

    def _opt_pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        self.hook_calls += 1
        if self._making_state or (
            not self._backwards and not self._opt_depth and _makes_state(optimizer)
        ):
            self._making_state += 1  # a step inside it is part of it
            return None
        self._opt_depth += 1
        self._opt_seen = True
        self._grad_left = None  # (read only while no optimizer is seen; it held a parameter)
        if self.disabled or self._opt_depth > 1:  # a step inside a step: the outer one counts
            return None
        if self._rank_unknown:
            self._rank_unknown = not spawned.learn_rank()
        try:
            first = self._mark is None
            self._closure_now = self._closure_repeat = False
            now = self._transition("closure_pre" if self._closure_loop else "opt_pre", "optimizer")
            if first:
                # No forward seen before the first step's optimizer: with a closure (LBFGS)
                # the whole step is inside it. Else no DDP module watched (FSDP, a plain
                # model): the step began when its first batch came out of the DataLoader, as
                # a DDP step begins at its forward (the batch's wait not in it). Without that
                # either, its beginning is not known, nor its time: the optimizer's own (12 ms
                # of pytorch/examples' ImageNet step of 1.25 s on CPU) passed for it.
                closure = args[1] if len(args) > 1 else kwargs.get("closure")  # args[0]: self
                self._step_start = now if callable(closure) else self._first_draw
            if not self._first_released and self._pending:
                self._release_first()
        except Exception as exc:
            self._fail(exc)
        return None

    def _opt_post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        self.hook_calls += 1
        if self._making_state:
            self._making_state -= 1
            return None
        if self._opt_depth > 1:  # the end of a step inside a step
            self._opt_depth -= 1
            return None
        self._opt_depth = 0
        if self.disabled:
            return None
        try:
            key = _optimizer_key(optimizer)
            if self._ddp_seen and not self._fwd_seen:
                # a second optimizer in the same iteration: part of the next step
                self._transition("opt_post", "data")
            elif self._joins(key):
                self._join(key)
            else:
                if not self._plain_looked and not self._models and not self._draws:
                    self._watch_plain(optimizer)
                ender = self._ender_ref
                if ender is None or ender() is not optimizer:
                    self._ender_ref = _weak(optimizer)
                self._finish_step(key)
        except Exception as exc:
            self._fail(exc)
        return None

    def _watch_plain(self, optimizer: Any) -> None:
        """The first step ended with no DDP module and no batch from a DataLoader: watch the
        module its optimizer trains (see :mod:`ddptui.rank.trained`), if one is found."""
        self._plain_looked = True
        root = trained.trained_root(self.torch.nn.Module, optimizer)
        if root is not None and root not in self._plain_roots:
            self._plain_roots.add(root)
            self._handles += [
                root.register_forward_pre_hook(_ModuleHook(self._plain_pre), with_kwargs=True),
                root.register_forward_hook(_ModuleHook(self._plain_post)),
            ]

    def _plain_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        """A forward of the module a script trains without DDP (no DDP module came since):
        its batch is the step's where it trains (grad on, training mode); else it begins an
        evaluation, whose time is no step's (nanochat's validation every so many steps read
        as a step of three times the others')."""
        self.hook_calls += 1
        if self.disabled or self._models or self._tracing():
            return None
        try:
            if module.training and self._grad_enabled():
                self._plain_samples += _batch_size(self.torch.Tensor, args, kwargs)
            else:
                self._eval_forward(True, module.training)
        except Exception as exc:
            self._fail(exc)
        return None

    def _plain_post(self, module: Any, args: tuple, output: Any) -> None:
        self.hook_calls += 1
        if self.disabled or self._models or self._tracing():
            return None
        if not (module.training and self._grad_enabled()):
            try:
                self._eval_forward(False)
            except Exception as exc:
                self._fail(exc)
        return None

    def _scaler_skipped(self, optimizer: Any) -> None:
        """``GradScaler.step`` skipped the optimizer's step (inf or NaN gradients: its first
        steps, while fp16's scale comes down, or a run gone NaN): the iteration is a step all
        the same, one that updated nothing. Ended as a step of no optimizer time, so that the
        steps, samples and rates are the script's iterations; left open, each skipped one ran
        into the next, and a run whose every step is skipped showed none at all."""
        if self.disabled or not (self._seg in _BWD or self._loss_count):
            return  # no training forward or backward since the last step: nothing to end
        self._opt_pre(optimizer, (), {})
        self._opt_post(optimizer, (), {})

    def _joins(self, key: int) -> bool:
        """Whether the optimizer ``key`` steps in the iteration of the step that ended last
        rather than ending one of its own: the script draws each step's batch from a
        DataLoader (the last step drew one), none was drawn since, and this is another
        optimizer than the one that ended that step (over other parameters: one made anew
        each step over the same ones is the same), not yet stepped since (DCGAN's
        ``optimizerG.step()`` after ``optimizerD.step()`` on the same batch). One optimizer
        stepping again on its step's batch joins it too where the script steps several
        optimizers an iteration (one joined a step before) on a batch it draws for each (the
        last two steps each drew from the same dataset): StyleGAN's lazy
        regularization steps the generator's optimizer a second time on every fourth
        iteration's batch, the discriminator's on every sixteenth (NVlabs/stylegan3 counted
        50 steps a rank for its 32 iterations). Elsewhere an optimizer that steps again with
        no batch drawn since ends a step each time: a script that overfits one batch
        (``next(iter(loader))``), or one of a single optimizer that makes a batch itself.

        A script that draws no batch from any DataLoader (tensors sliced by rank, a memmap,
        data made up) says nothing of its iterations but its optimizers: there, another
        optimizer than the one that ended the last step, not yet stepped since, joins it as
        well. udit4code/Pytorch-Distributed-101's manual data-parallel SGD steps a
        single-process reference model's optimizer on rank 0 after each step: rank 0
        counted 20 steps to rank 1's 10, every other one with the reference's loss. Two
        optimizers that take turns, an iteration each, would count as one step in two.

        Where the optimizer that ended the last step is gone, no: that step's optimizer is
        forgotten here (and, without DDP, the module the next one trains is looked for)."""
        if self._draws:
            return False
        ender = self._ender_ref
        if ender is not None and ender() is None:
            # The optimizer that ended the last step is gone: an optimizer made anew (with
            # its model: a script's next stage, or the next configuration it compares on
            # made-up data), not another optimizer of that step's iteration. Each new
            # model's first step joined the last model's step, and was lost (its samples
            # too). Without DDP, the module the new optimizer trains is watched in turn.
            self._ender_ref, self._step_ender = None, 0
            self._plain_looked = False
            return False
        if key == self._step_ender or key in self._joined:
            return self._steady_draws and self._several_optimizers
        return self._step_drew or (self._passes < 0 and self._step_ender != 0)

    def _join(self, key: int) -> None:
        """A further optimizer's step in the same iteration (see :meth:`_joins`): its time is
        the next step's (from here to the next forward: ``data``); its losses are its own
        objective's (a GAN's generator), not the step's loss, and its forwards drew no batch:
        no samples."""
        if key != self._step_ender:
            self._several_optimizers = True
        self._joined.add(key)
        self._transition("opt_post", "data")
        self._forget_losses()
        self._scaled = None
        self._samples = self._plain_samples = 0
        self._module_samples.clear()
        self._outputs.clear()
        self._fwd_seen = False

    def _forget_losses(self) -> None:
        """The losses gathered since the last step ended: taken into a finished step's read
        (which keeps its list), or not the step's (a joined optimizer's)."""
        if self._losses:
            self._losses = []
        self._loss_count = self._folded = self._backwards = 0
        self._summed_losses = False
        if self._loss_divisors:
            self._loss_divisors.clear()  # no new list on every step

    # -- ending a step ---------------------------------------------------------------------------
    def _finish_step(self, ender: int, at: float | None = None) -> None:
        """The optimizer ``ender`` (its id; 0: none, see _end_without_optimizer) ended a
        training step, now or ``at`` (a time already passed): hand it to the drainer."""
        self._step_thread = get_ident()
        losses = self._losses
        # Gradient accumulation that divides each micro-batch's loss by their number
        # (``loss = loss / accumulation_steps``, nanoGPT's and most scripts' way), or by the
        # items of the whole window (the HF Trainer's): the step's loss is the sum of what went
        # into ``backward()`` (the mean before nanoGPT's division), not the quotients' mean.
        count, divisors = self._loss_count, self._loss_divisors
        summed = count > 1 and (
            self._summed_losses
            # several losses of one batch: the terms of one objective, which their gradients
            # add up to (DCGAN's discriminator: its loss on real, then on generated images)
            or self._draws == 1
            or all(d == count or d is WINDOW or d is UNREAD for d in divisors)
        )
        if count > 1:
            self._several_losses = True
        scale = (count if summed else 1, self._loss_factor)
        held = len(losses) + self._folded  # the losses the list holds (see _keep_loss)
        self._forget_losses()
        cuda = self._cuda is not None
        if cuda:
            # Copies to pinned memory, queued before the step's last event: read together.
            host_losses = [self._to_host(value) for value in losses]
        # After a closure's backward the optimizer updates: ``optimizer``, not ``data``.
        self._transition("closure_post" if self._closure_now else "opt_post", "data", at)
        self._closure_loop, self._closure_now = self._closure_now, False
        self._closure_repeat = False
        now = self._mark
        start = self._step_start
        step_time = max(0.0, now - start - self._eval_spent) if start is not None else None
        self._eval_spent = 0.0
        custom = self._custom
        read: Any  # a CudaStepRead or LossRead (a GPU), or (phases, loss values, scale, held)
        if cuda and len(self._marks) > 1:
            read = CudaStepRead(self._marks, host_losses, custom, scale, held)
            self._marks = [("start", self._marks[-1][1])]
        else:
            # Without any DDP module (FSDP, a plain model) no forward is seen: the time before
            # the optimizer step cannot be split into data, forward, backward and comm, and a
            # split made up of it would mislead (and feed the straggler rule). Only the custom
            # phases the script times itself go, if any; the step time goes in any case.
            phases: dict[str, float] | None = self._acc if self._ddp_seen else None
            wait = self._step_wait
            if phases is not None and wait is not None and not cuda:
                # The step drew its batches from a DataLoader: ``data`` is its wait there;
                # the rest before the forward is the script's (or its framework's) own work,
                # ``other``: Lightning's backbone example read 37 % data, 0 % other; its wait
                # in the loader is 25 % of its 12 ms steps, its hooks before each step 10 %.
                extra = phases["data"] - wait
                if extra > 0.0:
                    phases["data"] = wait
                    phases["other"] += extra
            if custom:
                phases = {**phases, **custom} if phases is not None else dict(custom)
            on_gpu = None
            if losses and not cuda and not self._ddp_seen:  # a GPU's loss, no DDP module
                on_gpu = [
                    value.device
                    for value in losses
                    if type(value) is not float and value.device.type == "cuda"
                ]
            if cuda:
                read = (phases, None, None, 0)
                self._marks = self._marks[-1:]
            elif on_gpu:  # to the host behind its kernels
                copies = [self._to_host(value) for value in losses]
                event = self.torch.cuda.Event()
                event.record(self.torch.cuda.current_stream(on_gpu[-1]))
                read = LossRead(event, copies, phases, scale, held)
            else:
                # A CPU's losses: a plain tensor's read as its backward began (a float
                # here), any other's read now, as it is when the step ends. Read later by the
                # drainer, a script's own in-place all-reduce of its loss after the step raced
                # it (facebookresearch/pycls's ``scaled_all_reduce``: a rank's own loss, the
                # ranks' mean or, between the sum and its scaling, twice the mean, from step
                # to step). Only the values are read on the step's path; the drainer makes
                # the step's loss of them.
                values: list[float] | None = None
                if len(losses) == 1 and type(losses[0]) is float:
                    values = losses  # most steps: the list is the step's to keep
                elif losses:
                    try:
                        values = _host_values(losses)
                    except Exception:
                        values = None
                read = (phases, values, scale, held)
        self._acc = _NO_PHASES.copy()
        self._step_wait = None
        self._steps_ended += 1
        if self._ignite_engines and self._epochs_planned is None:
            # The ignite engine whose run ends a training step trains (an evaluator never
            # does, though its first batch may come while the model is still in training
            # mode): its max_epochs is the run's plan.
            state = getattr(self._ignite_engines[-1], "state", None)
            self._plan_epochs(getattr(state, "max_epochs", None))
        if custom:
            self._custom = {}
        # With DDP, its training forwards' samples, but no more than the batches the step
        # drew from a DataLoader, where it drew any, and those the steps before drew ahead of
        # theirs: a GAN's or a contrastive script's several forwards of one batch are one
        # batch, and a batch drawn ahead of its step (a fetcher that prefetches the next) is
        # the next step's: under timm's prefetcher with gradient accumulation an epoch's last
        # step draws one micro-batch of its two, the other drawn in the step before (it
        # counted 4 samples of 8 before). Without DDP, or where the forwards' inputs hold no
        # tensor to count, the batches drawn; without either, the forwards of the module the
        # optimizer trains (_watch_plain).
        samples = drawn = self._loader_samples
        if self._ddp_seen:
            if not self._draws or drawn <= 0:
                samples, self._drawn_ahead = self._samples, 0
            elif self._samples <= 0:  # inputs that say no count (DETR's NestedTensor): drawn
                self._drawn_ahead = 0
            else:
                drawn += self._drawn_ahead
                samples = min(self._samples, drawn)
                self._drawn_ahead = min(drawn - samples, self._loader_samples)
        elif drawn <= 0:
            samples = self._plain_samples  # a module trained without DDP (_watch_plain)
        self._samples = self._loader_samples = self._plain_samples = 0
        self._module_samples.clear()
        self._outputs.clear()
        if self._length_it is not None and self._steps_ended <= 2:
            # The second step's draws from that pass (the first's may include a batch
            # fetched ahead; a second loader's draws are not that pass's).
            if self._steps_ended == 2:
                if self._pass_length and self._length_draws:
                    self._loader_steps = self._pass_length // self._length_draws
                self._length_it = None
            self._length_draws = 0
        # What the next optimizer's step is measured against (see _joins).
        drew = self._draws > 0
        data = self._loader_data if drew else 0
        self._steady_draws = drew and data == self._drew_from
        self._step_ender, self._step_drew, self._drew_from, self._draws = ender, drew, data, 0
        if self._joined:
            self._joined = set()
        self._fwd_seen = False
        self._suspect = None  # a pass with a step in it trains
        self._step_start = now
        if self._last_pass is not None:  # the sampler of the pass started last fed this step
            self._last_pass.trained = True
            self._last_pass = None
        active = self._active
        if active:
            watches = self._watches
            for key in active:
                watch = watches.get(key)
                if watch is not None:
                    watch.end_step()
            active.clear()
        # Off the step path: the drainer thread makes the event and sends it (within
        # SEND_INTERVAL_S). Only the first step waits for the next one to start.
        self._pending.append((self._epoch, samples, step_time, read, time.monotonic(), time.time()))
        if self._first_released:
            self._drainer.poke()

    def _to_host(self, value: Any) -> Any:
        """A step's loss on its way to the host: a GPU's copied into pinned memory behind the
        kernels that made it (read once the device has passed the copy), a host's read now
        (it costs nothing)."""
        if type(value) is float:  # read as its backward began (see _backward_call)
            return value
        if value.device.type != "cuda":
            return float(value.item())
        host = self.torch.empty((), dtype=value.dtype, pin_memory=True)
        host.copy_(value.detach(), non_blocking=True)
        return host

    def _release_first(self) -> None:
        """The step after the first has started: the first may go (at once: ddptui learns the
        rank is past its start-up even if it stalls now)."""
        self._first_released = True
        self._drainer.now()
        # A run with no DDP module (one process: the HF Trainer and accelerate make none)
        # still gets its framework's epochs and evaluations, from its second step on.
        self._attach_frameworks()

    def _attach_frameworks(self) -> None:
        """Follow HF accelerate's loaders, the HF Trainer's evaluations and training loss,
        PyTorch Lightning's validations, torchmetrics, ignite's, fastai's and SpeechBrain's
        evaluations, where loaded and not yet followed."""
        if not self._accelerate_attached:
            self._attach_accelerate()
        if not self._transformers_attached:
            self._attach_transformers()
        if len(self._lightning_attached) < len(LIGHTNING_LOOPS):
            self._attach_lightning()
        if not self._torchmetrics_attached:
            self._attach_torchmetrics()
        if not self._ignite_attached:
            self._attach_ignite()
        if not self._fastai_attached:
            self._attach_fastai()
        if not self._speechbrain_attached:
            self._attach_speechbrain()

    def _drain(self) -> bool:
        """The drainer thread's work: send the finished steps that can go. Returns whether
        to stay awake (something was sent, or a GPU step's values are still on the way)."""
        if not self._pending or self.disabled:
            return False
        try:
            with self._send_lock:
                sent = self._send_ready()
                if sent and not self.explicit and self._get_reporter is not None:
                    self._get_reporter().flush()  # one message per drain: already batched
        except Exception as exc:
            self._fail(exc)  # said once, on stderr; the hooks stop, training goes on
            return False
        return sent or (bool(self._pending) and self._first_released)

    def _send_ready(self, final: bool = False) -> bool:
        """With ``_send_lock`` held: send (or, in explicit mode, keep for the next explicit log)
        the finished steps whose values are readable now, in order; ``final``: the first step
        too, though the next has not started. Returns whether any went."""
        pending = self._pending
        me = threading.get_ident()
        if self._draining == me:
            return False  # the reporter asked for a flush from inside our own delivery
        self._draining = me
        sent = False
        group: list[tuple[Any, ...]] = []  # fast steps that go as one event (see MERGE_BELOW_S)
        grouped = 0.0  # their time
        try:
            while pending:
                if not (self._first_released or final or self.explicit):
                    return sent
                epoch, samples, step_time, read, now, wall = pending[0]
                if read is None:
                    phases = loss = None
                elif type(read) is tuple:  # on the host already
                    phases, values, scale, held = read
                    # Made when sent (_sent_loss): an event of several fast steps sends only
                    # its last step's loss, and making every step's cost the drainer a third
                    # of its time, with the GIL held.
                    loss = (values, scale, held) if values else None
                    if len(pending) > MAX_PENDING_HOST:  # the drainer far behind: the oldest
                        phases = loss = None  # goes without its values
                else:  # a GPU step's: once the device has passed its events
                    try:
                        if read.query():
                            values = dict(read.values())
                        elif len(pending) > MAX_PENDING:
                            values = {}  # the device far behind: the oldest goes without
                        else:
                            return sent
                    except Exception:
                        values = {}
                    phases, loss = values.get("phases"), values.get("loss")
                pending.popleft()
                step = (epoch, samples, step_time, phases, loss, now, wall)
                mergeable = self._mergeable(step_time)
                if group and not (mergeable and self._joins_group(group, grouped, step)):
                    self._deliver_group(group)  # in order: the group's steps came first
                    group, grouped = [], 0.0
                if mergeable:
                    group.append(step)
                    grouped += step_time
                else:
                    self._deliver(*step)
                sent = True
            return sent
        finally:
            if group:
                self._deliver_group(group)
            self._draining = None

    def _mergeable(self, step_time: float | None) -> bool:
        """Whether a step may go in one event with others: a timed step under MERGE_BELOW_S,
        after the first step sent, while the hooks send the steps."""
        return (
            step_time is not None
            and step_time < MERGE_BELOW_S
            and self.steps_sent > 0
            and not self.explicit
        )

    @staticmethod
    def _joins_group(group: list[tuple[Any, ...]], grouped: float, step: tuple[Any, ...]) -> bool:
        """Whether ``step`` (a mergeable one) goes in the same event as the steps of
        ``group`` (``grouped`` seconds of them): of the same epoch, with phases as they have
        them or not, and within MERGE_S of step time."""
        first = group[0]
        return (
            step[0] == first[0]
            and (step[3] is None) == (first[3] is None)
            and len(group) < MAX_STEPS_PER_EVENT
            and grouped + step[2] <= MERGE_S
        )

    def _deliver_group(self, group: list[tuple[Any, ...]]) -> None:
        """The steps of ``group`` as one event at the last one's end: their samples, time and
        phases summed, and the last one's loss (the latest that has one), so that every loss
        sent is a step's own, at its number, as the script has it."""
        if len(group) == 1:
            self._deliver(*group[0])
            return
        epoch, *_, now, wall = group[-1]
        phases: dict[str, float] | None = None
        if group[0][3] is not None:
            phases = {}
            for member in group:
                _add_into(phases, member[3])
        loss = None
        for member in reversed(group):
            loss = _sent_loss(member[4])
            if loss is not None:
                break
        self._deliver(
            epoch,
            sum(member[1] for member in group),
            sum(member[2] for member in group),
            phases,
            loss,
            now,
            wall,
            steps=len(group),
        )

    def _deliver(
        self,
        epoch: int | None,
        samples: int,
        step_time: float | None,
        phases: dict[str, float] | None,
        loss: float | tuple[Any, ...] | None,  # a tuple: made when sent (_sent_loss)
        now: float,
        wall: float,
        steps: int = 1,
    ) -> None:
        if self.explicit:
            if phases:
                _add_into(self._carry, phases)
            self._withheld += samples
            return
        loss = _sent_loss(loss)
        self._samples_sent += samples
        get_reporter = self._get_reporter
        if get_reporter is None:
            # first report: keeps the rank light until then (msgspec, the protocol)
            from ddptui.rank import reporter as reporter_module

            get_reporter = self._get_reporter = reporter_module.get_reporter
            get_reporter().before_send(self.send_ready)
        reporter = get_reporter()
        # The first step's time starts at its first forward (no step ended before it): its
        # batch's wait is not in it, and its samples over it were no rate. A data-bound
        # script's first step read 8,000 samples/s a rank against 105 after, and the
        # throughput chart's scale hid the run's real rate. Its time and phases go; no rate
        # is made of them (as an explicit ``ddptui.log``'s first step has none).
        reporter.log_step_at(
            now,
            wall,
            loss=loss,
            phases=phases,
            epoch=epoch,
            samples=samples,
            step_time=step_time,
            rated=self.steps_sent > 0,
            steps=steps,
        )
        if self._loader_steps:
            # The steps a pass over the training DataLoader makes: an epoch's length for
            # progress and ETA where the script announces none (until the run shows one).
            steps, self._loader_steps = self._loader_steps, 0
            if steps <= MAX_LOADER_STEPS:
                reporter.note("loader_steps", steps=steps)
                self._loader_steps_sent = True
        self.steps_sent += 1
        if self.steps_sent == 1:
            # Out at once (not batched): ddptui learns the rank is past its start-up even if
            # it stalls before the batch's next send (the hang limit is longer before it).
            reporter.flush()

    def send_ready(self) -> None:
        """Send the finished steps that can go, now, from the calling thread: what the
        reporter calls before any other event of this rank, so steps keep their order
        before an evaluation, an epoch's end or the rank's end."""
        if not self._pending or self.disabled:
            return
        with self._send_lock:
            self._send_ready()

    def flush(self, timeout: float = 1.0) -> None:
        """Send every finished step (the first too), waiting at most ``timeout`` for GPU
        events; the rest go without their device values."""
        deadline = time.monotonic() + timeout
        with self._send_lock:
            while self._pending and time.monotonic() < deadline:
                self._send_ready(final=True)
                if self._pending:
                    time.sleep(0.001)
            while self._pending:
                epoch, samples, step_time, _, now, wall = self._pending.popleft()
                self._deliver(epoch, samples, step_time, None, None, now, wall)

    def at_exit(self) -> None:
        """The process ends: the drainer stops and every finished step goes out."""
        try:
            self._drainer.stop()
            if not self.disabled:
                self._tensorboard_eval()  # the last epoch's evaluation
                if self._steps_ended and not self._opt_seen and self._seg == "after_bwd":
                    # The last of the steps that ended without an optimizer (no forward
                    # after it to end it): ended at its backward's return, as they were.
                    self._end_without_optimizer()
                self.flush()
        except Exception:
            pass

    # -- the public API's side ---------------------------------------------------------------------
    def explicit_log(self, metrics: dict[str, Any]) -> None:
        """``ddptui.log`` was called: stop sending steps; give it the phases measured since
        the previous explicit log (unless it brings its own ``phases``). The steps a pass over
        the training DataLoader makes are no longer the steps the rank reports (a script may
        log every 10th): said so, if they went."""
        first = not self.explicit
        if first:
            self._loader_steps = 0
            if self._loader_steps_sent and not self.disabled:
                self._loader_steps_sent = False
                from ddptui.rank import reporter as reporter_module

                reporter_module.get_reporter().note("loader_steps")
        self.explicit = True
        if self.disabled:
            return
        try:
            with self._send_lock:  # the drainer thread adds to the carry under it too
                self._send_ready(final=True)
                carried, self._carry = self._carry, {}
                if first:
                    self._take_over_samples(metrics)
            if "phases" in metrics:
                return
            phases = carried
            if not phases and self._custom and self._mark is None:  # no step measured
                phases, self._custom = dict(self._custom), {}
            if phases:
                metrics["phases"] = phases
        except Exception as exc:
            self._fail(exc)

    def _take_over_samples(self, metrics: dict[str, Any]) -> None:
        """The script's first ``ddptui.log(samples=n)``: its ``n`` counts the samples since
        it began counting, its latest steps', and the hooks sent some of those steps already
        (a script that logs every 100th step: up to 99 of them, counted twice; +0.4 % of a
        run's samples). Its ``n`` less what it shares with the steps sent: beyond the
        samples of the steps withheld since ``ddptui.log`` took over and of the step under
        way, it covers sent ones. A script that logs every step shares none."""
        samples = metrics.get("samples")
        if type(samples) is not int or samples <= 0 or not self._samples_sent:
            return
        unsent = self._withheld + self._samples
        shared = min(self._samples_sent, max(0, samples - unsent))
        if shared:
            metrics["samples"] = samples - shared

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)

    def add_custom(self, name: str, seconds: float) -> None:
        name = str(name)
        custom = self._custom
        if name in custom:
            custom[name] += seconds
        elif len(custom) < MAX_CUSTOM_PHASES:
            custom[name] = seconds
        else:
            self.phases_ignored += 1


class _SamplerPasses:
    """What the hooks know of one DistributedSampler: a weak reference to it, the epoch at its
    last pass, its passes, whether it was ever told its epoch, whether it fed a training step."""

    __slots__ = ("ref", "epoch", "passes", "told", "trained")

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.epoch: int | None = None
        self.passes = 0
        self.told = False
        self.trained = False


#: What a training pass's first batch changes, kept until the pass proves it trains (see
#: Instrument._untrained_pass).
_PASS_STATE = (
    "_passes",
    "_epoch",
    "_epoch_tells",
    "_pass_it",
    "_pass_batches",
    "_pass_ended",
    "_pass_began",
    "_pass_length",
    "_length_it",
    "_length_draws",
    "_samples",
    "_loader_samples",
    "_draws",
    "_loader_data",
    "_drawn_ahead",
    "_fwd_seen",
    "_ddp_seen",
    "_step_wait",
    "_first_draw",
    "_mark",
    "_seg",
    "_step_start",
)


def _resolve(seg: str, nxt: str) -> str:
    """The phase of a segment without a gradient split, closed by event ``nxt``."""
    if seg == "closure":  # an optimizer step's time before its closure's forward
        return "data"
    if nxt == "closure_post":  # a closure's backward returned: the update follows
        return "backward" if seg == "bwd" else "optimizer"
    if seg == "ddp_pre":
        return "forward" if nxt == "fwd_post" else "comm"
    if seg == "data" and nxt == "closure_pre":  # before a closure loop's optimizer step
        return "data"
    if seg in ("data", "after_bwd"):
        return "other" if nxt in ("opt_pre", "bwd_return", "closure_pre") else "data"
    if seg == "bwd":
        return "backward"
    return seg  # forward, optimizer, other


_SEGMENTS = ("data", "after_bwd", "bwd", "ddp_pre", "forward", "optimizer", "other", "closure")
_EVENTS = (
    "fwd_pre", "inner_pre", "fwd_post", "bwd_return", "opt_pre", "opt_post", "closure_pre",
    "closure_post",
)  # fmt: skip
_RESOLVE = {(seg, nxt): _resolve(seg, nxt) for seg in _SEGMENTS for nxt in _EVENTS}
#: The phase of a gradient-split segment's rest (last gradient → event ``nxt``).
_AFTER_GRAD = {
    nxt: "comm" if nxt in ("bwd_return", "opt_pre", "closure_pre") else "data" for nxt in _EVENTS
}
_AFTER_GRAD["closure_post"] = "optimizer"


def _optimizer_key(optimizer: Any) -> int:
    """Which optimizer steps, as :meth:`Instrument._joins` tells them apart: by its first
    parameter (an optimizer a script makes anew each step over the same parameters is the
    same one), else by the object."""
    try:
        return id(optimizer.param_groups[0]["params"][0])
    except Exception:  # no parameter groups, or none in the first: the object itself
        return id(optimizer)


def _weak(value: Any) -> weakref.ref | None:
    """A weak reference to ``value``; None where it takes none."""
    try:
        return weakref.ref(value)
    except TypeError:
        return None


def _host_loss(copies: list[Any], scale: LossScale, count: int) -> float | None:
    """A step's loss from its host copies (pinned tensors the device has filled, or floats
    read already: a CPU's, see ``Instrument._backward_call``): :func:`_loss_mean` of their
    values; None without any, or where one cannot be read or they make none (``fsum`` of an
    inf and a -inf raises)."""
    try:
        losses = _host_values(copies)
        return _loss_mean(losses, scale, count) if losses else None
    except Exception:
        return None


def _sent_loss(loss: Any) -> float | None:
    """A pending step's loss as it is sent: made from its host values (``_send_ready`` keeps
    them, ``(values, scale, count)``, until then), or as it is (a float, None)."""
    return _host_loss(*loss) if type(loss) is tuple else loss


def _host_values(copies: list[Any]) -> list[float]:
    """The values of host losses: floats read already, or host tensors read now."""
    return [h if type(h) is float else float(h.item()) for h in copies]


def _loss_mean(losses: list[float], scale: LossScale, count: int) -> float:
    """The step's loss from its ``count`` losses, whose values (some of them sums) are
    ``losses``: their mean times the accumulation's ``scale[0]`` (unfolded, exactly their
    mean), or, where they are parts each run of which its total follows, the totals' sum
    (each a micro-batch's share of the step's, as its parts are shares of it: torchtitan
    divides every micro-batch's by the step's tokens); times ``scale[1]``, the rank's loss
    factor.

    torchtitan's chunked loss calls ``backward()`` on each chunk's loss (its part of the
    step's) as it computes it, then on their total, which carries the gradients on through
    the model: 0.87 was read where its log said 8.0 (9 losses' mean, 8 parts and their sum)."""
    summed, factor = scale
    if count > 2:
        if count == len(losses):
            totals = _totals(losses)
        else:  # folded: a total only after all the parts, the first of them a folded sum
            totals = losses[-1:] if _sum_of(losses[-1], math.fsum(losses[:-1])) else []
        if totals:
            return math.fsum(totals) * factor
    mean = _mean(losses) if count == len(losses) else sum(losses) / count
    return mean * summed * factor


def _totals(losses: list[float]) -> list[float]:
    """The totals, where ``losses`` are parts each run of which (two or more) its total
    follows (torchtitan's chunks, then their total, for each micro-batch), else []."""
    totals: list[float] = []
    parts, run = 0, 0.0  # the parts since the last total, and their sum
    for value in losses:
        if parts > 1 and _sum_of(value, run):
            totals.append(value)
            parts, run = 0, 0.0
        else:
            parts, run = parts + 1, run + value
    return totals if not parts else []


def _makes_state(optimizer: Any) -> bool:
    """Whether an optimizer step, with no ``backward()`` since the last step, only makes the
    optimizer's state: a fresh optimizer (no state yet) stepped with every learning rate 0.
    torch's distributed checkpoint does so to have a state to load a checkpoint into, or to
    save (``_init_optim_state``: zero gradients, zero learning rate), and torchtitan with a
    copy of its own: its restarted attempt read a first step with no loss and no samples,
    one step more than it took. Reads no device tensor; never raises."""
    try:
        if optimizer.state:
            return False
        rates = [group["lr"] for group in optimizer.param_groups]
        return bool(rates) and all(_zero_rate(lr) for lr in rates)
    except Exception:
        return False


def _zero_rate(lr: Any) -> bool:
    """A learning rate of 0: a number, or a 0-dim CPU tensor (one on a device is not read)."""
    if type(lr) in (int, float):
        return lr == 0
    device = getattr(lr, "device", None)
    return device is not None and device.type == "cpu" and lr.dim() == 0 and bool(lr == 0)


def _fsdp_ranks(fsdp: Any) -> int | None:
    """The ranks an FSDP2 module reduces its gradients over (its mesh's: the shards', times
    the replicas' where it is hybrid), read from its state; None where it cannot be."""
    try:
        return int(fsdp._get_fsdp_state()._fsdp_param_group.mesh_info.mesh.size())
    except Exception:
        return None


def _sum_of(total: float, parts: float) -> bool:
    """Whether ``total`` is ``parts`` (their sum), to float32's rounding, and not zero."""
    return total != 0 and math.isfinite(total) and abs(total - parts) <= 1e-5 * abs(total)


def _mean(values: Iterable[float]) -> float:
    """The mean; one value exactly as it is (-0.0 stays -0.0)."""
    values = list(values)
    return values[0] if len(values) == 1 else sum(values) / len(values)


#: Where PyTorch Lightning's evaluation loop is, in its two packages.
LIGHTNING_LOOPS = (
    "lightning.pytorch.loops.evaluation_loop",
    "pytorch_lightning.loops.evaluation_loop",
)
LIGHTNING_TRAINING_LOOPS = (
    "lightning.pytorch.loops.training_epoch_loop",
    "pytorch_lightning.loops.training_epoch_loop",
)
#: ``log_eval``'s own arguments: a logged number of one of these names is no extra.
_EVAL_FIELDS = frozenset({"epoch", "loss", "accuracy", "count"})
#: The words that name a loss, and an accuracy, among a framework's logged numbers.
LOSS_WORDS = frozenset({"loss"})
ACCURACY_WORDS = frozenset({"acc", "accuracy", "acc1", "top1"})


#: Words that name a logged number as training's (``train_loss``), and as an evaluation's.
TRAINING_WORDS = frozenset({"train", "training"})
EVALUATION_WORDS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test"})


def _words(name: Any) -> set[str]:
    """A logged number's name in words: split at whatever is not a letter or a digit."""
    return set(_name_parts(name))


def _name_parts(name: Any) -> list[str]:
    """A logged number's name in words, in order (see :func:`_words`)."""
    return [p for p in re.split(r"[^0-9a-z]+", str(name).lower()) if p]


def _metric_named(names: Iterable[Any], words: frozenset[str]) -> Any:
    """The name among ``names`` that says it is a loss (or an accuracy): one of its words
    (split at whatever is not a letter or a digit, a trailing ``epoch`` left out:
    Lightning's ``val_loss_epoch``) is in ``words``. Of several, the one of fewest words
    (``val_loss`` before ``val_recon_loss``), then the first; None when none is."""
    best: tuple[int, Any] | None = None
    for name in names:
        parts = _name_parts(name)
        if parts and parts[-1] == "epoch":
            parts.pop()
        if words.intersection(parts) and (best is None or len(parts) < best[0]):
            best = (len(parts), name)
    return None if best is None else best[1]


#: What :func:`_divisor` gives for a loss normalized over its accumulation window: the HF
#: Trainer (transformers 4.46 and later, ``average_tokens_across_devices``, its default) divides
#: each micro-batch's summed loss by the items of every micro-batch of the optimizer step on
#: every rank, then multiplies it by the world size, so that the micro-batches' losses add up
#: to the step's mean loss (the figure it logs).
WINDOW = "window"
#: A step's first loss's divisor, not read while no step of the run had several losses
#: (``Instrument._divisor_of``): taken as its step's others'.
UNREAD = "unread"


#: Most trailing multiplications and divisions of a loss :func:`_divisor` looks through.
SCALINGS_READ = 4
_SCALINGS = ("DivBackward0", "MulBackward0")


def _divisor(loss: Any) -> float | str | None:
    """How ``loss`` was scaled at its end, read from its graph without waiting for any device:
    the number it was divided by last (``loss / 4``: a CPU number or 0-dim tensor), or
    :data:`WINDOW` when its trailing scalings by 0-dim numbers both divide and multiply (the HF
    Trainer's ``loss / items * world_size``, with or without a ``/ 1`` after it: the values,
    maybe on a device, stay unread), or None. Never raises."""
    try:
        node, top, divided, multiplied = loss.grad_fn, None, False, False
        for _ in range(SCALINGS_READ):
            kind = type(node).__name__  # None's type is NoneType: the loop ends there
            if kind not in _SCALINGS or node._saved_other.dim():
                break
            if kind == "DivBackward0":
                divided = True
            else:
                multiplied = True
            if top is None:
                top = node
            node = node.next_functions[0][0]
        if divided and multiplied:
            return WINDOW
        if top is None or type(top).__name__ != "DivBackward0":
            return None
        other = top._saved_other
        if other.device.type != "cpu":
            return None
        return float(other.item())
    except Exception:
        return None


def _add_into(total: dict[str, float], phases: dict[str, float]) -> None:
    for name, seconds in phases.items():
        total[name] = total.get(name, 0.0) + seconds


def _draw_size(tensor: type, batch: Any) -> int:
    """The samples of a batch a DataLoader gave (0 for a batch of the script's own kind):
    see :func:`_batch_size`; a batch of parts each a sequence of samples (torchvision's
    detection references and DETR collate with ``tuple(zip(*batch))``: images, and the
    targets' dicts) is as many samples as its dicts; a batch object of its own that says its
    ``batch_size`` (PyTorch Geometric's ``Batch``: its graphs, or a ``NeighborLoader``'s seed
    nodes, where the model's first tensor holds every node of them) is that many."""
    try:
        size = _batch_size(tensor, (batch,), {})
        if size == 0 and type(batch) in (list, tuple):
            for part in batch:
                if isinstance(part, list | tuple) and part and isinstance(part[0], dict):
                    return len(part)
        elif size == 0 and not isinstance(batch, tensor | list | tuple | dict):
            told = getattr(batch, "batch_size", None)
            if type(told) is int and 0 < told <= MAX_TOLD_BATCH:
                return told
        return size
    except Exception:  # a batch of the script's own kind: not ours to judge
        return 0


def _wraps_output(inner: Any, inst: Any) -> bool:
    """Whether the DDP module around ``inner`` returns other tensors than its module's
    (``static_graph`` or ``find_unused_parameters``: its output goes through its
    ``_DDPSink``), so that only its own post hook sees what the script gets (ijepa's encoder,
    ``static_graph=True``, whose output its predictor takes)."""
    ref = inst._inner_owner.get(id(inner))
    ddp = ref() if ref is not None else None
    return bool(
        getattr(ddp, "static_graph", False) or getattr(ddp, "find_unused_parameters", False)
    )


def _forward_samples(tensor: type, args: tuple, kwargs: dict, outputs: list[Any]) -> int:
    """The samples a training forward adds to its step: :func:`_batch_size`, none where its
    input is what a training forward of a DDP module returned in this step (``outputs``,
    weak references): a DDP module fed another's output, ijepa's predictor taking its
    context encoder's, sees the same samples again (each step of 16 read 32). Another
    module's output counts: pytorch/examples' ``ddp_rpc`` feeds its DDP module the lookups of
    an embedding held over RPC, its only count of the step's samples."""
    if outputs and args and isinstance(args[0], tensor):
        first = args[0]
        if any(ref() is first for ref in outputs):
            return 0
    return _batch_size(tensor, args, kwargs)


def _batch_size(tensor: type, args: tuple, kwargs: dict) -> int:
    """Dim 0 of the first ``tensor`` (torch.Tensor) among the forward's arguments (one level
    into lists, tuples and dicts); 0 when there is none. A list (or tuple) of dicts is one
    record a sample, over a tensor a list before it held: torchvision's detection models take
    a list of images, each ``[C, H, W]`` (their dim 0 the channels), with a list of target
    dicts, and their loaders (DETR's too) give a tuple of each."""
    if args and isinstance(args[0], tensor):  # the usual ``model(x)``: one C call
        try:
            return args[0].size(0)
        except (IndexError, RuntimeError):  # a 0-dim tensor
            return 0
    found = None
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, tensor):
            if found is None:
                return int(value.shape[0]) if value.dim() else 0
            continue
        if isinstance(value, list | tuple):
            if value and isinstance(value[0], dict):
                return len(value)
            inner = value
        elif isinstance(value, dict):
            inner = value.values()
        else:
            continue
        if found is None:
            for item in inner:
                if isinstance(item, tensor):
                    found = int(item.shape[0]) if item.dim() else 0
                    break
    return found or 0


def _logged_scalar(value: Any, tensor: type) -> bool:
    """Whether a framework's logged ``value`` is one number: an int or float (not a bool),
    or a ``tensor`` (torch.Tensor) of one element (read when sent, a GPU's off the path)."""
    if isinstance(value, tensor):
        return value.numel() == 1
    return isinstance(value, int | float) and not isinstance(value, bool)


def _own_methods(module: Any, class_name: str, *names: str) -> tuple[type, list[Any]] | None:
    """``module``'s class ``class_name`` and its own (not inherited) methods ``names``, to
    wrap; None where the module, the class or one of them is missing (a framework's version
    that moved them)."""
    cls = getattr(module, class_name, None) if module is not None else None
    if not isinstance(cls, type):
        return None
    methods = [cls.__dict__.get(name) for name in names]
    return (cls, methods) if all(callable(method) for method in methods) else None


def _pass_length(it: Any) -> int:
    """Batches in a DataLoader iterator's pass (``len``: its batch sampler's), 0 when it has
    no length (an IterableDataset) or says anything else."""
    try:
        length = len(it)
    except Exception:
        return 0
    return length if type(length) is int and length > 0 else 0


def _data_keys(data: Any, depth: int) -> set[int]:
    """The ids of an engine's ``data`` and of the datasets it reads from, ``depth`` levels
    down (a DataLoader's ``dataset``, a ``Subset``'s)."""
    keys: set[int] = set()
    for _ in range(depth + 1):
        if data is None:
            break
        keys.add(id(data))
        data = getattr(data, "dataset", None)
    return keys


def _plain_number(value: Any) -> int | float | None:
    """``value`` as a plain int or float when it is a finite number (numpy's too; not a
    bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return int(value)
    return float(value) if math.isfinite(value) else None


def _warn(message: str) -> None:
    try:
        print(f"ddptui: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass
