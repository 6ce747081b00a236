"""Running plans for real: model specs, profiler, calibration, executor (torch.distributed)."""
