"""``python -m bench k=v ...``: the Hydra entry point.

A run submitted to SLURM goes through the sweeper and its launcher even when it is one run: Hydra runs a
single run without any launcher, so ``hydra/launcher=slurm`` (or ``submit=slurm``) on the command line
without ``--multirun`` is made a one-job sweep here, and both spellings set the other (``submit`` tells
validation that the run's GPUs are the cluster's, not this machine's: bench/machine/hardware_rules.py).  The overrides
it adds join the command line's own overrides, before Hydra's options: Hydra's parser takes the overrides as one
run of words, so ``hydra/launcher=slurm --cfg hydra`` (``--info``, ``--resolve``, ``--help``) keeps working.
A config-group typo (``model=lama3_8b``) is one line and exit 2 (bench/run/cli_errors.py).
"""
import sys
from pathlib import Path

import hydra

from bench.run.cli_errors import install as one_line_group_typos
from bench.run.config import register_configs
from bench.launch.job import main_task

# bench's Hydra plugins (hydra_plugins/bench_plugins: the sweeper, the SLURM / local-tasks
# launchers) sit next to the bench package; Hydra finds plugins only in the hydra_plugins
# namespace, so make them importable from any working directory.
_ROOT = str(Path(__file__).resolve().parents[1])
if (Path(_ROOT) / "hydra_plugins" / "bench_plugins").is_dir() and _ROOT not in sys.path:
    sys.path.append(_ROOT)

SUBMITTERS = ("slurm",)  # conf/hydra/launcher options that submit jobs (the schema's submit choices)
SINGLE_RUN_EXIT = "hydra_plugins.bench_plugins.callbacks.SingleRunSweepCallback"  # exits as a single run does
# Hydra's own commands: with one of them given, no --multirun is added
_COMMANDS = {"-m", "--multirun", "-r", "--run", "-c", "--cfg", "-i", "--info", "-h", "--help", "--hydra-help",
             "-sc", "--shell-completion"}
# Hydra's options that take the next word as their value (unless written --option=value); --info takes one of
# its topics if one follows
_VALUED = {"-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
           "--experimental-rerun"}
_INFO = {"-i", "--info"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's options with their values, the overrides), each in the command line's order.  Hydra's parser
    takes the overrides as one run of words: an override added after ``--cfg hydra`` would be "unrecognized"."""
    options: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            overrides.append(a)
        else:
            options.append(a)
            takes = a in _VALUED or (a in _INFO and i + 1 < len(argv) and argv[i + 1] in _INFO_TOPICS)
            if takes and "=" not in a and i + 1 < len(argv):
                i += 1
                options.append(argv[i])
        i += 1
    return options, overrides


def _value(argv: list[str], key: str) -> str | None:
    """The last ``key=value`` of the command line (``+key=`` / ``++key=`` too)."""
    found = None
    for a in argv:
        k, eq, v = a.lstrip("+").partition("=")
        if eq and k == key:
            found = v
    return found


def submit_argv(argv: list[str]) -> list[str]:
    """The command line with a submission made whole: ``hydra/launcher=slurm`` adds ``submit=slurm`` and
    ``submit=slurm`` adds ``hydra/launcher=slurm``; either adds ``--multirun`` unless a Hydra command is given.
    A contradiction (``submit=slurm hydra/launcher=local_tasks``) exits with one line."""
    launcher, submit = _value(argv, "hydra/launcher"), _value(argv, "submit")
    if submit in (None, "null") and launcher not in SUBMITTERS:
        return argv
    options, out = split_argv(argv)  # the overrides, then Hydra's options: the added overrides join the first
    if submit in (None, "null"):
        if submit == "null":
            sys.exit(f"invalid config: submit=null contradicts hydra/launcher={launcher}, which submits; "
                     "drop one of them")
        out.append(f"submit={launcher}")
    elif launcher is None:
        if submit not in SUBMITTERS:
            sys.exit(f"invalid config: submit={submit}: valid: null, {', '.join(SUBMITTERS)}")
        out.append(f"hydra/launcher={submit}")
    elif launcher != submit:
        sys.exit(f"invalid config: submit={submit} contradicts hydra/launcher={launcher}; set only one of them")
    if not _COMMANDS & set(a.split("=", 1)[0] for a in options):
        options.insert(0, "--multirun")  # one run or a sweep: the sweeper plans, submits and waits for it
        out.append(f"hydra.callbacks.bench_sweep._target_={SINGLE_RUN_EXIT}")
    return (options[:1] + out + options[1:]) if options[:1] == ["--multirun"] else out + options


register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    return main_task(cfg)


if __name__ == "__main__":
    sys.argv[1:] = submit_argv(sys.argv[1:])
    one_line_group_typos()
    main()
