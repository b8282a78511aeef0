"""The hardware: presets and profiles, their rules, NCCL's environment per link regime, and where each rank runs."""
