"""hydra/sweeper=bench (bench.sweep.sweeper.BenchSweeper) and hydra/sweeper=tune (bench.sweep.search.TuneSweeper)."""
from bench.sweep.search import TuneSweeper as _TuneSweeper
from bench.sweep.sweeper import BenchSweeper as _BenchSweeper


class BenchSweeper(_BenchSweeper):
    """Resume, statuses, cost guard and the sweep summary around Hydra's sweep syntax."""


class TuneSweeper(_TuneSweeper):
    """The knob search: successive halving over each strategy's declared knob candidates."""
