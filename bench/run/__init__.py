"""What a run is and its checks: the config schema, validation, the layout and its rules, tuning profiles, the output folder and run records."""
