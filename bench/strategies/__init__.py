"""Strategies, one module each; each registers its StrategySpec (bench/strategies/registry.py finds them)."""
