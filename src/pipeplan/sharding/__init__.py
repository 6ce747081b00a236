"""Operator partitioning (Auto-MAP's OPP, §3.2-3.3 and §4): the tensor IR from torch.export
(``program``), derivation rules and propagation, linkage decisions, what a plan costs, the
integer program and the DQN that choose one (``shard``), and DTensor runs of the result
(``tensor_parallel``). Apart from the pipeline planners: nothing outside the CLI imports it."""
