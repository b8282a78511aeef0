"""The memory plan and the throughput prediction over every strategy's terms: the topology, measured bests and the calibration's error."""
