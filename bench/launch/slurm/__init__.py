"""Runs through submitit: SLURM (``hydra/launcher=slurm``) and local tasks (``hydra/launcher=local_tasks``).

Launcher side.  hydra-submitit-launcher 1.2 builds ONE executor per sweep from
``hydra.launcher.*`` (resolved once, when the launcher is instantiated from the primary config,
before any job's overrides exist) and submits every job of the sweep as one job array with those
parameters: nodes, tasks and GPUs are the same for all jobs, so a sweep over ``world_size=1,2,4``
cannot get one task per GPU per job, and ``${world_size}`` in the launcher config would resolve to
the default world size.  :class:`BenchSlurmLauncher` / :class:`BenchLocalLauncher` subclass its
launchers and override ``launch``: for every job they compose the job's own config and set the
executor parameters before submitting it:

* ``tasks_per_node`` = min(world_size, ``gpus_per_node``) (the largest divisor of world_size not
  above it), ``nodes`` = world_size / tasks_per_node, ``gpus_per_node`` = tasks_per_node (one task
  and one GPU per rank; none for device=cpu).  ``gpus_per_node`` in the launcher config is the
  number of GPUs of one cluster node; the local launcher runs every task on this machine;
* ``timeout_min`` is raised to run_timeout_s + 5 min where needed, so bench's own timeout
  fires first and records status ``timeout``; a SLURM job whose time limit is too short for
  ``signal_delay_s`` (timeout_min*60 <= signal_delay_s + 60: SLURM's time-limit warning could come
  at its start and end its tasks before bench handles it) is refused before sbatch (ConfigError);
* partition / account / qos / constraint / setup / srun_args / additional_parameters and the rest
  are passed through (``hydra.launcher.partition=gpu hydra.launcher.account=abc``);
* each job is submitted on its own (no array): SLURM runs them in parallel; bench's sweeper
  launches local jobs one at a time (submitit_local would run a whole sweep at once);
* a job sbatch refuses (GPUs, a partition or an account the cluster does not have), or bench
  refuses, is recorded ``failed`` with the error, and the sweep goes on (no run is left ``pending``);
* when a job is over is SLURM's word: ``squeue -t all`` every few seconds (a job in a final state, or
  no longer listed).  submitit asks ``sacct``, which needs SLURM's accounting database: without
  one, a job that ended without submitit's result file (SLURM's time limit, scancel, node failure,
  bench's own watchdog, which ends the processes with os._exit) was never seen to end and the sweep
  waited forever; with one, only after submitit's polling delay (up to 10 minutes);
* a job that ended without a final status (killed before rank 0 could record one) is marked by the
  launcher (the controller) from SLURM's last state: ``timeout`` when SLURM says TIMEOUT / TimeLimit,
  ``oom`` for OUT_OF_MEMORY, else ``failed``, with SLURM's state and reason and submitit's error;
* a job SLURM accepted but will never start as the cluster is configured (pending with reason
  PartitionConfig - more nodes than the partition has -, BadConstraints, ...: ``collect.NEVER_STARTS``)
  is cancelled and its run recorded ``failed`` with SLURM's reason, not waited for forever.

Modules: ``resources`` (each job's size and time limit), ``submit`` (one executor and submission
per job), ``collect`` (when a job is over, and its run's status), ``interrupt`` (Ctrl-C), ``record``
(a run's folder and the status bench gives it; the jobs left queued by ``hydra.launcher.wait=false``, which
bench/sweep/collect.py follows later), ``preflight`` (why nothing can be submitted - no SLURM client, no
cluster, no such partition - in one line before any run is recorded, and sbatch's refusals in one line),
``launchers`` (the two launcher classes, registered in hydra_plugins/bench_plugins/launchers.py).

Planning side.  The sweeper plans every job on the machine that submits (a login node, often without a GPU):
``submit=slurm`` (set with hydra/launcher=slurm by bench/__main__.py, which also makes one run a one-job
sweep) tells validation that the run's GPUs are the allocation's, so ``hardware=<preset>`` is planned for
here and ``hardware=auto`` without a visible GPU is refused (bench/machine/hardware_rules.py); the job checks the
device it landed on against the preset when it validates again on its node.

Task side (bench/launch/job.py ``run_task``, bench/launch/task.py ``launch_task_rank``).  Under submitit there is
no torchrun: the task function runs in every task; when the job
has world_size tasks, this process IS a rank: it exports the torch.distributed environment from
submitit (``TorchDistributedEnvironment().export()``: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; a world_size=1 run in its one task too), validates and calls ``bench.launch.worker.worker_main``
directly.  Rank 0 writes
status.json and metrics.json, the other ranks only their rank files.  A watchdog thread in every
rank ends the run on ``run_timeout_s`` or when another rank has failed (its failure_rank*.json
appears in the shared run folder), so one failing rank cannot leave the others waiting in a
collective; rank 0 records the root cause first.  The same watchdog acts on SLURM's SIGTERM (seen
through a wakeup pipe, so also while the main thread is blocked in a collective): rank 0 asks squeue
why - reason ``TimeLimit``: status ``timeout``; else (scancel, preemption) ``failed``, reason
"cancelled"; a node SLURM found failed (reason NodeDown): ``failed``, naming the node - records it
within KillWait, and every rank exits.  Each rank writes where it runs at its start
(``node_rank{r}.json``, bench/machine/placement.py): on several nodes, a root cause that is a lost
connection names the node it pointed to, and whether that node's ranks left any record.  submitit's
own handlers would ignore
SIGTERM (nothing recorded before SLURM's SIGKILL) and, on the time-limit warning (USR2,
signal_delay_s before the limit, up to a minute early), requeue the job or raise "timed-out too many
times" inside the run: bench only logs the warning (a benchmark run is not resumable).  A requeued
job (``scontrol requeue``, preemption) runs again into the same folder; the launcher waits for it.
Ctrl-C in the sweep process: the launcher records its unfinished runs ``interrupted`` before it
cancels their jobs, and the ranks keep that status (resume=true runs them again).  A job given one task (e.g.
``hydra/launcher=submitit_slurm`` with its defaults) runs the local elastic launch inside the
allocation instead (all ranks on that node).
"""
