"""End a process's torch.distributed state so that no c10d thread outlives it.

``dist.destroy_process_group()`` shuts the groups down and forgets them, but a gloo group's C++
object (with its two ``pt_gloo_runloop`` worker threads, the ``gloo_tcp_loop`` thread and, on
rank 0, the TCPStore's ``pt_tcpstore_uv`` server thread) lives on while anything still refers to
it.  Things that do (torch 2.13, megatron-core 0.16):

* the default arguments of ``torch.distributed.nn.functional`` (``def all_reduce(...,
  group=group.WORLD)``): imported after ``init_process_group`` - which DTensor's first
  constructor call does (``torch._disable_dynamo`` imports ``torch._dynamo``, which imports it) -,
  they hold the world group for the life of the process;
* every ``DeviceMesh`` keeps its groups in ``_pg_registry``, and DTensor's caches (the
  ``lru_cache`` of ``torch.distributed.tensor._redistribute._gen_transform_infos``, the sharding
  propagator's) keep DTensorSpecs, hence meshes;
* ``megatron.core.parallel_state.destroy_model_parallel()`` leaves
  ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP`` set;
* the frames of a traceback (a rank that raised) keep the model and the strategy (the callers
  clear them: ``traceback.clear_frames``).

Such a group is then never destroyed before the interpreter finalizes (gdb: no call of
``~ProcessGroupGloo`` before ``Py_FinalizeEx``), and a gloo thread that needs the GIL during the
finalization (a work's future callback, a Python-owned tensor it releases) ends in
``PyThread_exit_thread`` -> a forced unwind through a ``noexcept`` frame -> ``std::terminate``:
"terminate called without an active exception", SIGABRT, at random (a process started with
``spawn``, which exits through ``Py_FinalizeEx``: ``torch.multiprocessing.spawn`` in the tests,
``start_method=spawn`` ranks; the fork server's ranks leave through ``os._exit``).

:func:`release_process_groups` destroys the groups, then drops those references, so that the
groups' destructors (which drain the work queue and join their threads) run now, while the
interpreter is whole; it returns the c10d threads still running (none, when it worked).
Where some are left all the same (DeepSpeed: its engine holds its groups, and ZeRO's gradient and
module hooks hold the engine through autograd's C++ nodes, a cycle the garbage collector cannot
see), :func:`exit_without_finalizing` makes the process end like the fork server's ranks do.
"""
from __future__ import annotations

import atexit
import faulthandler
import gc
import logging
import os
import re
import sys
import types
from pathlib import Path

from bench.spec.schema import BenchConfig

# the names c10d's native threads give themselves (/proc/<pid>/task/<tid>/comm)
C10D_THREAD_PREFIXES = ("pt_gloo", "gloo_", "pt_tcpstore", "pt_nccl")


def c10d_threads() -> list[str]:
    """Names of this process's c10d / gloo / NCCL threads that are running now (Linux; [] elsewhere)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(C10D_THREAD_PREFIXES):
            names.append(name)
    return sorted(names)


def _drop_group_references() -> None:
    """Forget the process groups that outlive destroy_process_group (see the module docstring)."""
    from torch.distributed import ProcessGroup

    if "torch.distributed.device_mesh" in sys.modules:
        from torch.distributed.device_mesh import DeviceMesh

        for obj in gc.get_objects():
            if _is(obj, DeviceMesh):
                registry = getattr(obj, "_pg_registry", None)
                if isinstance(registry, dict):
                    registry.clear()
    # module globals that hold a group (megatron.core.parallel_state, deepspeed.utils.groups, ...) and
    # default arguments bound to one when their module was imported (torch.distributed.nn.functional);
    # a tuple of defaults holds no object the garbage collector tracks, so gc never lists it: look.
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.startswith(_HOLDERS):
            _drop_module_groups(name, mod, ProcessGroup)


def _is(obj, typ) -> bool:
    """isinstance by the object's own type, reading nothing of ``obj``. isinstance() through torch 2.13's
    OpaqueBaseMeta (ProcessGroup's and DeviceMesh's metaclass) runs Python: 0.18-0.20 s over the 327k objects of a
    process that imported DeepSpeed, this 0.08 s (results/2026-12-07-h100x1-rank-teardown). It reads ``__class__``,
    at which torch.distributed.reduce_op warns, and on a dead weak proxy it raises ReferenceError (seen on GPU runs:
    torch.compile and DeepSpeed leave them behind)."""
    return issubclass(type(obj), typ)


def _drop_module_groups(name: str, mod, group_type) -> None:
    """In module ``mod``: globals that are a group become None, groups leave module-level dicts, and
    default arguments that are a group (its functions', its classes' methods') become None."""
    for attr, value in list(vars(mod).items()):
        if _is(value, group_type):
            setattr(mod, attr, None)
        elif _is(value, dict) and any(_is(v, group_type) for v in value.values()):
            for k in [k for k, v in value.items() if _is(v, group_type)]:
                del value[k]
        elif _is(value, types.FunctionType):
            _drop_default_groups(value, group_type)
        elif _is(value, type) and value.__module__ == name:
            for member in list(vars(value).values()):
                member = getattr(member, "__func__", member)  # staticmethod / classmethod
                if _is(member, types.FunctionType):
                    _drop_default_groups(member, group_type)


_HOLDERS = ("torch.distributed", "megatron.core", "deepspeed")  # the libraries _drop_group_references looks into


def _drop_default_groups(fn, group_type) -> None:
    """Default arguments that are a group become None (what a default of group.WORLD is before
    init_process_group)."""
    if fn.__defaults__ and any(_is(v, group_type) for v in fn.__defaults__):
        fn.__defaults__ = tuple(None if _is(v, group_type) else v for v in fn.__defaults__)
    if fn.__kwdefaults__ and any(_is(v, group_type) for v in fn.__kwdefaults__.values()):
        fn.__kwdefaults__ = {k: None if _is(v, group_type) else v for k, v in fn.__kwdefaults__.items()}


def release_process_groups(abort: bool = False) -> list[str]:
    """Destroy every process group (``abort``: abort an NCCL one instead, for a rank that failed:
    a peer may be blocked in a collective this rank will never join), drop the references that
    keep the groups' C++ objects alive, and collect them.  Returns the c10d threads still running
    ([] when every group is gone)."""
    import torch.distributed as dist

    if not dist.is_available():
        return c10d_threads()
    if dist.is_initialized():
        abort_fn = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort and abort_fn is not None and "nccl" in str(dist.get_backend()):
            abort_fn()
        else:
            dist.destroy_process_group()
    try:  # best effort: a teardown never fails a run whose results are written
        _drop_group_references()
    except Exception as e:  # noqa: BLE001
        logging.getLogger("bench.teardown").warning("dropping the process groups' references: %s: %s",
                                                    type(e).__name__, e)
    gc.collect()
    return c10d_threads()



def exit_without_finalizing(exit_code: int) -> None:
    """End this process with ``os._exit(exit_code)`` when it exits (the first atexit handler to
    run), instead of finalizing the interpreter with c10d threads still running: how the fork
    server's ranks always end.  Logs and standard streams are flushed first."""
    def _exit() -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(exit_code)

    atexit.register(_exit)


TEARDOWN_TIMEOUT_HEADER = re.compile(r"^Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!$", re.M)  # faulthandler's dump
# A failed rank's teardown (its exit; under SLURM, aborting its groups) ends after this long (or
# teardown_timeout_s, if shorter): after an out-of-memory inside a CUDA graph capture on 4 H100s the
# failing rank never exited (its NCCL abort blocks: bench/launch/worker.py _close_process_group), and its peers
# waited in a collective until run_timeout_s.  (The launcher ends a run whose failed rank is still
# there a little later: bench/launch/local.py FAILURE_GRACE_S.)
FAILED_TEARDOWN_S = 5


def failed_teardown_s(run: BenchConfig) -> int:
    """How long a rank that failed (its failure recorded) may take to exit."""
    return min(FAILED_TEARDOWN_S, run.teardown_timeout_s)


def arm_teardown_deadline(run_dir: Path, rank: int, seconds: int) -> None:
    """The results (or the failure) are written; what is left is teardown, which has hung on 2 H200s
    after NCCL collectives captured in CUDA graphs, and on 4 H100s after a failed capture, holding the
    run until run_timeout_s.  faulthandler's own C thread (it needs no GIL, so it fires even inside a
    blocked NCCL or CUDA call, or during the process's exit) appends every thread's Python stack to
    this rank's log after ``seconds`` and ends the process with exit code 1; the launcher keeps the
    result (TEARDOWN_TIMEOUT_HEADER)."""
    log_file = open(Path(run_dir) / f"rank{rank}.log", "a")  # kept open: faulthandler writes to its fd
    faulthandler.dump_traceback_later(seconds, exit=True, file=log_file)
    _keep_open.append(log_file)


_keep_open: list = []  # the files arm_teardown_deadline gave faulthandler
