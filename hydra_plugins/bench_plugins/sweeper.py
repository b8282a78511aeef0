"""hydra/sweeper=bench (bench.sweep.sweeper.BenchSweeper) and hydra/sweeper=knob_search
(bench.sweep.search.KnobSearchSweeper)."""
from bench.sweep.search import KnobSearchSweeper as _KnobSearchSweeper
from bench.sweep.sweeper import BenchSweeper as _BenchSweeper


class BenchSweeper(_BenchSweeper):
    """Resume, statuses, cost guard and the sweep summary around Hydra's sweep syntax."""


class KnobSearchSweeper(_KnobSearchSweeper):
    """The knob search: successive halving over each strategy's declared knob candidates."""
