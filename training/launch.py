"""``accelerate launch --cpu --num_processes N``: start the N processes accelerate does not.

Without GPUs, ``accelerate launch`` runs its "simple" launcher, which starts exactly one process
(several only through ``mpirun``, with ``--mpirun_hostfile``): ``--num_processes 2`` only sets
``MASTER_ADDR``/``MASTER_PORT``, the one process sees no ``WORLD_SIZE`` and trains alone. A trainer
started that way finds the launch command in its parent process, and replaces itself with
``torch.distributed.run`` starting N processes of the same command (gloo, the CPU backend), which
accelerate then sees as a multi-CPU run.
"""

from __future__ import annotations

import os
import sys

# variables that mean the process already is one rank of a multi-process launch
_RANK_VARS = ("WORLD_SIZE", "LOCAL_RANK", "RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def parent_command() -> list[str]:
    """The parent process's command line ([] when it cannot be read)."""
    try:
        import psutil  # an accelerate dependency

        return psutil.Process(os.getppid()).cmdline()
    except Exception:  # no such process, no permission: nothing to read
        return []


def launch_arguments(command: list[str]) -> list[str] | None:
    """The arguments after ``accelerate launch`` (or ``accelerate-launch``, ``-m accelerate.commands.launch``)
    in ``command``; None when it is not an accelerate launch."""
    for i, arg in enumerate(command):
        base = os.path.basename(arg)
        if (arg == "launch" and i > 0 and os.path.basename(command[i - 1]).startswith("accelerate")) \
                or base == "accelerate-launch" or arg == "accelerate.commands.launch":
            return command[i + 1:]
    return None


def requested_processes(args: list[str]) -> tuple[int | None, int]:
    """(num_processes, num_machines) of an ``accelerate launch`` argument list, read with accelerate's
    own parser (and the config file it names); num_processes None when it does not say."""
    from accelerate.commands.launch import launch_command_parser

    try:
        ns = launch_command_parser().parse_args(args)
    except SystemExit:  # not arguments accelerate would take: not our business
        return None, 1
    n, machines = ns.num_processes, ns.num_machines
    if ns.config_file:
        try:
            from accelerate.commands.config.config_args import load_config_from_file

            conf = load_config_from_file(ns.config_file)
            n = n if n is not None else conf.num_processes
            machines = machines if machines is not None else conf.num_machines
        except Exception:  # a config accelerate itself would have refused
            pass
    return n, machines or 1


def lone_cpu_process(env=None) -> bool:
    """Whether accelerate's CPU launcher, asked for more than one process, started this one alone."""
    env = os.environ if env is None else env
    # its simple launcher sets MASTER_ADDR only for more than one process (or machine); a real rank has WORLD_SIZE
    return _truthy(env.get("ACCELERATE_USE_CPU")) and "MASTER_ADDR" in env and not any(v in env for v in _RANK_VARS)


def missing_cpu_processes(env=None, command: list[str] | None = None) -> int | None:
    """N when this process is the only one ``accelerate launch --cpu --num_processes N`` (N >= 2,
    one machine) started; None otherwise."""
    if not lone_cpu_process(env):
        return None
    args = launch_arguments(parent_command() if command is None else command)
    if args is None:
        return None
    n, machines = requested_processes(args)
    if n is None or n < 2 or machines != 1:
        return None
    return n


def relaunch_command(n: int, env=None, argv: list[str] | None = None, main_module: str | None = None) -> list[str]:
    """``python -m torch.distributed.run`` starting ``n`` copies of this process's command."""
    env = os.environ if env is None else env
    argv = sys.argv if argv is None else argv
    if main_module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        main_module = spec.name if spec is not None else None
    target = ["-m", main_module] if main_module else [argv[0]]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
            "--master_addr", env.get("MASTER_ADDR", "127.0.0.1"), "--master_port", env.get("MASTER_PORT", "29500"),
            *target, *argv[1:]]


def start_missing_cpu_processes() -> None:
    """Replace this process by ``n`` ranks when ``accelerate launch --cpu`` started one of ``n``; return otherwise."""
    n = missing_cpu_processes()
    if n is None:
        if lone_cpu_process() and launch_arguments(parent_command()) is None:
            print("[dllm.train] warning: ACCELERATE_USE_CPU and MASTER_ADDR are set but this is no rank of a launch "
                  "and no accelerate launch command could be read: training with 1 process. To start N ranks on "
                  "CPUs: ACCELERATE_USE_CPU=1 torchrun --nproc_per_node N ...", file=sys.stderr, flush=True)
        return
    cmd = relaunch_command(n)
    print(f"[dllm.train] accelerate launch --cpu starts one process whatever --num_processes says; starting {n} "
          "with torch.distributed.run (gloo)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
