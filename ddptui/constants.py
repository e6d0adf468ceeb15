"""Facts shared by the CLI, the dashboard form, the launchers, the reporter and the trainers.

One home for each choice list and each environment variable name, so no two modules can
disagree about them. Stdlib only: the trainers and ``import ddptui`` read it too.
"""

from __future__ import annotations

#: How ranks are started on a node.
LAUNCHERS = ("spawn", "torchrun")
#: torch.distributed backends a process group can use.
BACKENDS = ("gloo", "nccl")
#: The ``--backend`` run option: a backend, or ``auto`` (nccl with CUDA ranks, else gloo).
BACKEND_CHOICES = ("auto", *BACKENDS)
#: Mixed precision: off, fp16 (autocast + GradScaler, CUDA), bf16 (autocast, CPU or CUDA).
AMP_MODES = ("off", "fp16", "bf16")
#: Where ranks compute.
DEVICES = ("cpu", "cuda")
#: The ``--device`` run option: a device, or ``auto`` (cuda when a GPU is visible).
DEVICE_CHOICES = ("auto", *DEVICES)

#: Ranks of a CPU run when ``--world-size`` is not given.
DEFAULT_CPU_WORLD_SIZE = 2
#: Without CUDA, at most this many ranks per usable core unless ``--oversubscribe``.
MAX_RANKS_PER_CORE = 4

# -- environment handed to every rank --------------------------------------------------------
#: Where ranks send telemetry (unset: ``ddptui.log`` is a no-op).
ENDPOINT_ENV = "DDPTUI_ENDPOINT"
#: Set in a worker that a script spawned (its rank is known only from its process group).
SPAWNED_ENV = "DDPTUI_SPAWNED"
#: The run id; also how teardown finds every process of a run.
RUN_ID_ENV = "DDPTUI_RUN_ID"
#: The run directory.
RUN_DIR_ENV = "DDPTUI_RUN_DIR"
#: CPU threads per rank chosen by the launcher (``OMP_NUM_THREADS`` and torch).
THREADS_ENV = "DDPTUI_THREADS"
#: The run's device choice (``cpu`` or ``cuda``): rank ``LOCAL_RANK`` uses ``cuda:LOCAL_RANK``.
DEVICE_ENV = "DDPTUI_DEVICE"
#: The pid of the process that started this one (ddptui for the driver, the driver for a
#: rank): a process that finds another parent at start-up was orphaned and exits.
PARENT_PID_ENV = "DDPTUI_PARENT_PID"
#: In a driver the ddptui command started before its run had an id: that ddptui's pid.
PRESTARTED_BY_ENV = "DDPTUI_PRESTARTED_BY"

# -- diagnosis ---------------------------------------------------------------------------------
#: The built-in phases of a training step, in order; together they make up the whole step
#: (see ddptui.rank.instrument). Custom ``ddptui.phase`` names are carried beside them.
PHASES = ("data", "forward", "backward", "comm", "optimizer", "other", "eval")
#: Set to 1 to run ranks without the zero-code instrumentation hooks (``--no-instrument``).
NO_INSTRUMENT_ENV = "DDPTUI_NO_INSTRUMENT"
#: The flag a rank passes its script with its local rank (``--local-rank-arg``), as
#: ``python -m torch.distributed.launch`` did: ``--local_rank=N`` before the script's own.
LOCAL_RANK_ARG_ENV = "DDPTUI_LOCAL_RANK_ARG"
#: What ``--on-hang`` may do with a hung run: tear it down (exit code 3) or keep it running.
ON_HANG = ("stop", "keep")
#: Longest ``--hang-timeout``, in seconds.
MAX_HANG_TIMEOUT_S = 1e6

# -- restarts (``--max-restarts``) -----------------------------------------------------------
#: Most restarts ``--max-restarts`` accepts.
MAX_RESTARTS = 100
#: The attempt number of a run's ranks (0 first, then 1 per restart); the reporter stamps it
#: on every event. ddptui sets it, and sets torchrun's name below to the same value.
ATTEMPT_ENV = "DDPTUI_ATTEMPT"
#: torchrun's name for the attempt number, for user scripts (0 on the first attempt).
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
#: Path of the run's last checkpoint (``RUN_DIR/checkpoint.pt``) when a restarted attempt has
#: one to resume from; unset otherwise.
RESUME_ENV = "DDPTUI_RESUME"

# -- stop with a checkpoint ------------------------------------------------------------------
#: The signal ddptui sends to every rank of a built-in trainer to ask it to stop after the
#: current step with a checkpoint (``s`` in the dashboard, the first Ctrl-C headless). A user
#: script that installs a handler for it (see the README) can opt in; by default ddptui
#: sends it only to the built-in trainers.
STOP_SIGNAL = "SIGUSR2"

# -- multi-node runs ---------------------------------------------------------------------------
#: Nodes of a multi-node run (set for every rank of one; absent on a single node).
NNODES_ENV = "DDPTUI_NNODES"
#: ddptui's own number for the node a process belongs to (teardown tells nodes sharing one
#: machine apart by it); the node rank in events is torch's ``GROUP_RANK``.
NODE_SLOT_ENV = "DDPTUI_NODE_SLOT"
#: ``ddptui join`` reads its token from here when none is given on its command line.
JOIN_TOKEN_ENV = "DDPTUI_JOIN_TOKEN"
#: Launchers of a whole job: the node launchers, or Slurm (srun starts one agent per node).
JOB_LAUNCHERS = (*LAUNCHERS, "slurm")

# -- step events -------------------------------------------------------------------------------
#: Most optimizer steps one step event may stand for (``protocol.Step.steps``): 25 ms of 6 µs
#: steps, far below any DDP step; the dashboard spends a moment on each of them.
MAX_STEPS_PER_EVENT = 4096
