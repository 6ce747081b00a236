"""Tensor-level IR from torch.export, sharding propagation and linkage groups (Auto-MAP §3.2-3.3)."""
