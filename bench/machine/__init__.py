"""The hardware: presets and profiles, their rules, and NCCL's environment per link regime."""
