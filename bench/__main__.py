"""``python -m bench k=v ...``: the Hydra entry point, nothing else."""
import hydra

from bench.config import register_configs
from bench.job import main_task

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg):
    return main_task(cfg)


if __name__ == "__main__":
    main()
