"""Aggregation of bench run folders into tables, plots and a report."""
