"""pipeplan: plan pipeline-parallel DNN training on real clusters.

Data flows one way: graph + cluster -> planner -> Plan -> Schedule -> simulator (or runtime).
"""

__version__ = "0.1.0"
