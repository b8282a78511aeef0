"""What a layout costs, as the strategies declare it: bytes each collective moves, bytes the activations keep."""
