"""Strategies, one module each; each registers its StrategySpec (bench/registry.py finds them)."""
