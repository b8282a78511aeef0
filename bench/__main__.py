"""``python -m bench k=v ...``: the Hydra entry point, nothing else."""
import sys
from pathlib import Path

import hydra

from bench.config import register_configs
from bench.job import main_task

# bench's Hydra plugins (hydra_plugins/bench_plugins: the sweeper, the SLURM / local-tasks
# launchers) sit next to the bench package; Hydra finds plugins only in the hydra_plugins
# namespace, so make them importable from any working directory.
_ROOT = str(Path(__file__).resolve().parents[1])
if (Path(_ROOT) / "hydra_plugins" / "bench_plugins").is_dir() and _ROOT not in sys.path:
    sys.path.append(_ROOT)

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    return main_task(cfg)


if __name__ == "__main__":
    main()
