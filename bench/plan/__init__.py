"""The memory plan and the throughput prediction: traffic on the topology, measured bests and the calibration."""
