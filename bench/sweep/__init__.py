"""Sweeps: the plan of a multirun, resume, run folders, cost guard, progress and the summary.

``hydra/sweeper=bench`` (the default, conf/hydra/sweeper/bench.yaml) sweeps like Hydra's basic
sweeper (the same cartesian product of ``a=1,2 b=x,y`` and ``hydra.sweeper.params``) plus, before
anything runs, a plan of every job:

* its resolved configuration and **run key** (bench/run/runs.py: a hash of the resolved configuration
  without the keys that do not change what runs; stored in the run's status.json and metrics.json);
* a pre-check (``bench.run.config.validate``): a combination that cannot run is recorded right away
  as status ``invalid`` with the reason, and no process (or SLURM job) is started for it; one the
  memory plan predicts will not fit is recorded ``skipped`` with the prediction (``force_run=true``
  runs it);
* with ``resume=true``: a job whose key already has a completed result anywhere in the sweep
  folder is skipped (so are failed/oom/timeout ones unless ``rerun_failed=true``, and invalid
  ones that are still invalid); an interrupted one (Ctrl-C: no result of its configuration) is
  run again;
* its folder: ``<sweep dir>/<job number>`` unless that folder holds a completed result, or a final
  result of another configuration; then ``<number>_<key[:8]>`` (``_2``, ``_3``, ... for repeats).
  A completed result is never written over; a failed attempt that is run again in place is moved
  to ``<folder>/.attempts/<n>/`` first.  The job's folder is passed to Hydra as
  ``hydra.sweep.subdir`` (quoted: ``1_67436339`` is that folder, not the number 167436339), so
  Hydra's own files (.hydra/, the job log) never touch another result;
* status ``pending`` written into the folder of every job that will run.

Then it prints how many runs the sweep expands to and, where earlier results exist (this sweep
folder, ``<cwd>/multirun`` and ``hydra.sweeper.history``), an estimate of GPU time; launches the
jobs one at a time (local launchers: one benchmark at a time, a live ``run i/N`` line each) or all
at once (``hydra/launcher=slurm``); and stops after a run that ended ``interrupted`` (Ctrl-C).
``dry_run=true`` (or ``hydra.sweeper.dry_run=true``) prints the plan, one memory-plan line per run,
and runs nothing.

Several sweep processes may run on one sweep folder at once (bench/sweep/claims.py): each plans holding
the folder's lock and claims each job just before it runs; a run folder claimed by another live
process is never chosen, moved aside or written; with ``resume=true`` a job another process runs
is waited for and one it completed is not run again, so two ``resume=true`` sweeps share the work.

:class:`SweepCallback` (``hydra.callbacks.bench_sweep``) prints the summary at the end of the
multirun, writes ``<sweep dir>/summary.json`` and sets the exit code: 0 when every run completed
or was invalid / skipped and one completed (a combination that cannot run does not fail a sweep), 2 (3) when
no run could run: every one invalid (or predicted not to fit), 130 when the sweep was interrupted, 1 when any
run failed, ran out of memory, timed out or never reported a status.  The reasons runs did not complete are
printed once each, with how many runs and which.  A sweep submitted without waiting
(``hydra.launcher.wait=false``) ends with its job ids instead; :mod:`bench.sweep.collect` reports it later.
Progress and summary are plain log lines (no carriage returns), fine in non-interactive logs.
"""
