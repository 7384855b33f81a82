"""graph/: the op graph of a computation after XLA fusion (an XLA fusion is one node)."""
from .opgraph import Edge, Node, OpClass, OpGraph, build_graph, classify_instruction
