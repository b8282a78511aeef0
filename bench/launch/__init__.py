"""Start the ranks of one run and turn how they ended into an outcome.

Two ways (DESIGN: "local: torch elastic launch; SLURM: this process IS a rank"):

* ``local.launch_local``: this process starts every rank;
* ``task.launch_task_rank``: inside a submitit/SLURM task, this process is one rank (bench/launch/slurm/
  sized the job: one task per rank).  A watchdog thread in every rank ends the run on
  ``run_timeout_s`` or when another rank has failed (its failure_rank*.json appears in the shared
  run folder), so one failing rank cannot leave the others waiting in a collective; rank 0 records
  the outcome, the root cause first;
* ``outcome``: how the ranks ended, as the run's status and root cause (both ways).

Local runs (every world size, 1 included, so each run gets a fresh process: CUDA memory,
NCCL state and a crash stay inside it) go through torch's elastic launch API, the one
``torchrun`` uses, with a c10d rendezvous on a free port and no restarts.  When any worker
fails, the elastic agent terminates the others and raises ``ChildFailedError``.  A run
that exceeds ``run_timeout_s``, or whose processes outlive ``teardown_timeout_s`` after it
completed, is ended the same way: a watcher thread sends this process SIGTERM, which the agent
turns into a shutdown of all workers (SIGTERM, then SIGKILL).
"""
