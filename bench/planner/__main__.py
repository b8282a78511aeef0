"""``python -m bench.planner``: bench/planner/cli.py."""
import sys

from bench.planner.cli import main

sys.exit(main())
