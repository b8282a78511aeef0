"""hydra/sweeper=bench (code: bench.sweep.BenchSweeper)."""
from bench.sweep import BenchSweeper as _BenchSweeper


class BenchSweeper(_BenchSweeper):
    """Resume, statuses, cost guard and the sweep summary around Hydra's basic sweep."""
