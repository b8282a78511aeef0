"""A run composed and checked: Hydra's config groups and validation (config.py), tuning profiles, the output folder, run keys and records, recorded runs re-planned."""
