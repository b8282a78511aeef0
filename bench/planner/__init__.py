"""The planner: the fastest layout that fits the user's whole job, and how long the job takes.

``python -m bench.planner model=llama3_8b hardware=a100_80gb nodes=2 gpus_per_node=8 model.seq_len=4096
tokens_per_step=1Mi train_tokens=1T`` composes the question with Hydra from conf/ (every bench key works),
searches strategies x tp x pp x cp x precision x compile x recompute x micro-batch and the strategies' own knobs
(bench/planner/search.py), each candidate validated, memory-planned and predicted as a dry run
(bench/planner/evaluate.py), and prints the ranked layouts with the command that runs each, tokens/s, MFU,
memory, verdict, days and GPU-hours (bench/planner/table.py); ``measure_top=K`` runs the first K as a bench
sweep and records the measured winners (bench/planner/measure.py).  ``resolve.choose`` is the same search for
one run's ``strategy.micro_batch_size=auto`` and ``tuning=best`` (bench/launch/job.py).
"""
