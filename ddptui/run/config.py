"""Building a run's options: raw values (strings from argparse or the dashboard form, or typed)
judged in one pass into a validated, frozen :class:`~ddptui.run.options.RunConfig`, so the CLI
and the form refuse bad input with the same one-line messages.

Everything that can be known before a process starts is checked: numbers (finite, in range)
and choices (:mod:`ddptui.run.options`), the device and the world size this machine can hold
(:mod:`ddptui.run.check_devices`), the trainer, its model and data, the script and the
arguments after ``--`` (:mod:`ddptui.run.check_target`), the ``--resume`` checkpoint, the
rendezvous URL and the run directory (:mod:`ddptui.run.check_files`), and a multi-node run's
addresses (:mod:`ddptui.run.cluster`). The checkpoint header and the trainer's own parser read
torch or the trainer module, so they run only when asked (``deep`` checks).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ddptui.constants import (
    AMP_MODES,
    BACKEND_CHOICES,
    DEFAULT_CPU_WORLD_SIZE,
    DEVICE_CHOICES,
    JOB_LAUNCHERS,
    MAX_HANG_TIMEOUT_S,
    MAX_RESTARTS,
    ON_HANG,
)
from ddptui.run.check_devices import check_world_size, needs_cuda_ranks, resolve_device
from ddptui.run.check_files import (
    check_checkpoint,
    check_init_method,
    check_run_dir,
    readable_file,
)
from ddptui.run.check_target import (
    check_model,
    check_module,
    check_script,
    missing_data,
    parse_trainer,
    trainer_args_problem,
)
from ddptui.run.cluster.addresses import (
    check_bind,
    check_endpoint,
    default_endpoint,
    outbound_address,
)
from ddptui.run.cluster.slurm import slurm_layout
from ddptui.run.machine import Machine
from ddptui.run.options import (
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_LOCAL_RANKS,
    MAX_NODES,
    MAX_SEED,
    MAX_WORKERS,
    Checks,
    ConfigError,
    RunConfig,
    clipped_number,
    default_workers,
    is_blank,
    new_run_id,
    option_flag,
    parse_choice,
    parse_float,
    parse_int,
    parse_local_rank_arg,
    parse_path,
    quoted,
)
from ddptui.run.registry import DEFAULT_TRAINER, registry

# -- limits (a value beyond these is a typo or an attack, not a run) -----------------------------


# -- parsing single values (shared by argparse and the dashboard form) ------------------


# -- building a whole config -------------------------------------------------------------
def build_config(
    raw: Mapping[str, Any], machine: Machine | None = None, *, deep: bool = True
) -> RunConfig:
    """Validate raw option values (strings or typed) into a :class:`RunConfig`.

    Raises :class:`ConfigError` for the first bad value. ``machine`` is detected when needed
    (device ``auto``/``cuda``, backend ``nccl``, AMP ``fp16``, ``--sync-bn``) and not given.
    ``deep=False`` skips the checks that import torch or the trainer (the ``--resume`` header
    and the arguments after ``--``).
    """
    errors: list[ConfigError] = []
    cfg = _build(raw, machine, errors, deep)  # one pass: the machine is asked at most once
    if errors:
        raise errors[0]
    return cfg


def check_options(
    raw: Mapping[str, Any], machine: Machine | None = None, *, deep: bool = True
) -> list[ConfigError]:
    """Every problem with ``raw``, in form order (empty when it can run)."""
    errors: list[ConfigError] = []
    _build(raw, machine, errors, deep)
    return errors


def _build(
    raw: Mapping[str, Any], machine: Machine | None, errors: list[ConfigError], deep: bool
) -> RunConfig:
    """The config ``raw`` describes, with every problem appended to ``errors`` (a value that
    failed is replaced by its default so that the remaining options are still judged)."""
    checks = Checks(errors)
    attempt = checks.attempt

    # -- what runs: a registered trainer or the user's script
    module_given = not is_blank(raw.get("script_module"))
    is_script = module_given or not is_blank(raw.get("script"))
    script_args = tuple(str(a) for a in (raw.get("script_args") or ()))
    trainers = registry()
    trainer, spec, script, script_module = DEFAULT_TRAINER, None, None, None
    if module_given and not is_blank(raw.get("script")):
        checks.fail("script", "--script and --module both name your code: give one of them")
    elif module_given:
        script_module, script = attempt(check_module, raw["script_module"]) or (None, None)
    elif is_script:
        script = attempt(check_script, raw["script"])
    else:
        name = raw.get("trainer")
        trainer = attempt(parse_trainer, DEFAULT_TRAINER if is_blank(name) else name, trainers)
        trainer = trainer or DEFAULT_TRAINER
        spec = trainers.specs.get(trainer)

    local_rank_arg = None
    if not is_blank(raw.get("local_rank_arg")):
        if is_script:
            local_rank_arg = attempt(parse_local_rank_arg, raw["local_rank_arg"])
        else:  # the trainers read LOCAL_RANK; an argument they do not take would stop them
            checks.fail(
                "local_rank_arg",
                "--local-rank-arg is for your script (--script or --module): the built-in "
                "trainers read LOCAL_RANK",
            )

    launcher_raw = raw.get("launcher")
    if is_blank(launcher_raw):
        launcher = "torchrun" if is_script else "spawn"
    else:
        launcher = attempt(parse_choice, "launcher", launcher_raw, JOB_LAUNCHERS) or "spawn"
    nnodes = _optional(raw, "nnodes", lambda v: parse_int("nnodes", v, 1, MAX_NODES), attempt)
    nproc = _optional(
        raw,
        "nproc_per_node",
        lambda v: parse_int("nproc_per_node", v, 1, MAX_LOCAL_RANKS),
        attempt,
    )
    if launcher == "slurm":
        environ = raw.get("environ")
        layout = attempt(slurm_layout, os.environ if environ is None else environ, nnodes, nproc)
        if layout is not None:
            nnodes, nproc = layout

    # -- numbers
    world_size = _optional(raw, "world_size", lambda v: parse_int("world_size", v, 1), attempt)
    workers = _optional(raw, "workers", lambda v: parse_int("workers", v, 0, MAX_WORKERS), attempt)
    epochs = _optional(raw, "epochs", lambda v: parse_int("epochs", v, 1, MAX_EPOCHS), attempt)
    batch_size = _optional(
        raw, "batch_size", lambda v: parse_int("batch_size", v, 1, MAX_BATCH_SIZE), attempt
    )
    lr = _optional(raw, "lr", lambda v: parse_float("lr", v), attempt)
    seed = attempt(parse_int, "seed", _default(raw, "seed", 0), 0, MAX_SEED)
    max_restarts = attempt(
        parse_int, "max_restarts", _default(raw, "max_restarts", 0), 0, MAX_RESTARTS
    )

    # -- where ranks compute, and how they talk
    device = attempt(parse_choice, "device", _default(raw, "device", "auto"), DEVICE_CHOICES)
    backend = attempt(parse_choice, "backend", _default(raw, "backend", "auto"), BACKEND_CHOICES)
    amp = attempt(parse_choice, "amp", _default(raw, "amp", "off"), AMP_MODES) or "off"
    sync_bn = bool(raw.get("sync_bn"))
    oversubscribe = bool(raw.get("oversubscribe"))
    device = device or "auto"
    if machine is None:
        needs_cuda_answer = device != "cpu" or backend == "nccl" or amp == "fp16" or sync_bn
        machine = Machine.detect() if needs_cuda_answer else Machine(0, "not asked (--device cpu)")
    resolved, backend = resolve_device(checks, machine, device, backend)
    if amp == "fp16":
        needs_cuda_ranks(checks, machine, resolved, "amp")
    if sync_bn:
        needs_cuda_ranks(checks, machine, resolved, "sync_bn")
    if nnodes is None and nproc is None:  # one node, as ever
        nnodes = 1
        if world_size is None:
            gpus = machine.cuda_devices
            world_size = gpus if resolved == "cuda" and gpus > 0 else DEFAULT_CPU_WORLD_SIZE
        else:
            check_world_size(checks, machine, resolved, world_size, oversubscribe)
    else:
        nnodes = nnodes or 1
        if nproc is None:
            gpus = machine.cuda_devices
            nproc = gpus if resolved == "cuda" and gpus > 0 else DEFAULT_CPU_WORLD_SIZE
        else:
            check_world_size(checks, machine, resolved, nproc, oversubscribe, per_node=True)
        if world_size is not None and world_size != nnodes * nproc:
            checks.fail(
                "world_size",
                f"--world-size {clipped_number(world_size)} disagrees with --nnodes {nnodes} x "
                f"--nproc-per-node {nproc} = {nnodes * nproc} ranks (leave --world-size out "
                "of a multi-node run)",
            )
        world_size = nnodes * nproc
    rdzv_endpoint, bind = _multinode_addresses(checks, raw, launcher, nnodes, is_script)
    if nnodes > 1 and launcher == "spawn":
        launcher = "torchrun"
    if max_restarts and (nnodes > 1 or launcher == "slurm"):
        checks.fail(
            "max_restarts",
            "--max-restarts restarts the ranks of one node; it does not work with --nnodes > 1 "
            "or --launcher slurm yet",
        )
    if workers is None:
        workers = default_workers(resolved, world_size, machine.cpu_count)
    elif is_script and not is_blank(raw.get("workers")):
        checks.fail(
            "workers",
            "--workers is an option of the trainers; a --script reads its own (after --)",
        )

    # -- the trainer's model, data and checkpoint
    model = None if is_blank(raw.get("model")) else str(raw["model"]).strip()
    if model is not None and spec is not None and spec.models:
        model = attempt(check_model, spec, model)
    data_dir = None
    if not is_blank(raw.get("data_dir")):
        data_dir = attempt(lambda v: str(parse_path("data_dir", v)), raw["data_dir"])
    if spec is not None and "--download" not in script_args:
        problem = missing_data(spec, data_dir or "data")
        if problem:
            checks.fail("data_dir", problem)

    resume = None
    if not is_blank(raw.get("resume")):
        resume = attempt(readable_file, "resume", raw["resume"], "resume checkpoint")
        if resume is not None and spec is not None and deep and not checks.failed:
            attempt(check_checkpoint, resume, spec, model)

    init_method = None
    if not is_blank(raw.get("init_method")):
        init_method = attempt(check_init_method, raw["init_method"])

    hang_timeout = _optional(raw, "hang_timeout", _parse_hang_timeout, attempt)
    on_hang = attempt(parse_choice, "on_hang", _default(raw, "on_hang", "stop"), ON_HANG) or "stop"

    run_id = str(raw.get("run_id") or new_run_id())
    run_dir = attempt(check_run_dir, raw.get("run_dir"), run_id)

    cfg = RunConfig(
        trainer=trainer,
        script=script,
        script_module=script_module,
        script_args=script_args,
        local_rank_arg=local_rank_arg,
        launcher=launcher,
        device=resolved,
        backend=backend or "gloo",
        amp=amp,
        world_size=world_size,
        workers=workers if not is_script else 0,
        oversubscribe=oversubscribe,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed if seed is not None else 0,
        data_dir=data_dir,
        run_dir=run_dir,
        resume=resume,
        init_method=init_method,
        sync_bn=sync_bn,
        model=model,
        max_restarts=max_restarts or 0,
        trainer_module=spec.module if spec is not None else None,
        run_id=run_id,
        hang_timeout=hang_timeout,
        on_hang=on_hang,
        instrument=not bool(raw.get("no_instrument")),
        flight_recorder=not bool(raw.get("no_flight_recorder")),
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        bind=bind,
    )
    if deep and spec is not None and spec.arg_parser and script_args and not checks.failed:
        problem = trainer_args_problem(spec, tuple(cfg.trainer_argv()))
        if problem:
            checks.fail("script_args", problem)
    return cfg


# -- the target ---------------------------------------------------------------------------------


# -- the device, the backend and the world size (one check for CUDA ranks) ----------------------


# -- multi-node addresses ------------------------------------------------------------------------
def _multinode_addresses(
    checks: Checks, raw: Mapping[str, Any], launcher: str, nnodes: int, is_script: bool
) -> tuple[str | None, str | None]:
    """(rendezvous HOST:PORT, bind address) of a multi-node run; (None, None) on one node."""
    given_rdzv, given_bind = raw.get("rdzv_endpoint"), raw.get("bind")
    if nnodes == 1 and launcher != "slurm":
        for name, value in (("rdzv_endpoint", given_rdzv), ("bind", given_bind)):
            if not is_blank(value):
                checks.fail(
                    name, f"{option_flag(name)} is for multi-node runs (--nnodes 2 or more)"
                )
        return None, None
    if launcher == "spawn" and not is_blank(raw.get("launcher")):
        checks.fail(
            "launcher",
            "a multi-node run starts its ranks under torchrun's c10d rendezvous: use "
            "--launcher torchrun (or slurm), or leave --launcher out",
        )
    if is_blank(given_rdzv):
        rdzv = checks.attempt(default_endpoint, launcher, raw.get("environ"))
    else:
        rdzv = checks.attempt(check_endpoint, "rdzv_endpoint", given_rdzv)
    bind = None
    if not is_blank(given_bind):
        bind = checks.attempt(check_bind, given_bind)
    elif launcher == "slurm":  # ddptui may run on a login host: its own outbound address
        bind = checks.attempt(check_bind, outbound_address())
    elif rdzv is not None:  # node 0 hosts the rendezvous: the same interface
        bind = checks.attempt(check_bind, rdzv.rpartition(":")[0].strip("[]"))
    return rdzv, bind


# -- files ---------------------------------------------------------------------------------------


# -- the trainer's own command line --------------------------------------------------------------


# -- small helpers -------------------------------------------------------------------------------


def _default(raw: Mapping[str, Any], key: str, default: Any) -> Any:
    value = raw.get(key)
    return default if is_blank(value) else value


def _parse_hang_timeout(text: Any) -> float:
    value = parse_float("hang_timeout", text, positive=False)
    if not 0 <= value <= MAX_HANG_TIMEOUT_S:  # False for NaN too
        raise ConfigError(
            "hang_timeout",
            f"--hang-timeout must be 0 (off) or seconds up to {MAX_HANG_TIMEOUT_S:g}, "
            f"got {quoted(text)}",
        )
    return value


def _optional(raw, key, parse, attempt):
    value = raw.get(key)
    return None if is_blank(value) else attempt(parse, value)
