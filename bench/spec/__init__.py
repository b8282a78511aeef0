"""What a run is, below everything that plans or runs it: the config schema, the layout and its rules, a run's overrides as words."""
