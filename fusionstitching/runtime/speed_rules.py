"""The factors by which a host kernel timed alone against XLA:CPU is left to XLA or replaces
XLA's (runtime/cpu_speed.py measures). Part of the plan's key (plan_key.py), which the call
path computes: this module imports nothing, so a young job's calls never load the compiler.
"""

# A kernel is left to XLA when, timed alone, it takes more than this many times XLA's time
# for the same instructions. Alone, each side pays an executable's cost of tens of us and
# XLA's several thunks wake its thread pool; inside the step neither does, so closer times
# decide nothing: the trial of the whole step does (runtime/executor.py). zoo BERT train: its
# 17 kernels measured faster alone ran the step in 1366 us, the 22 within 1.5x in 1187, XLA
# 1392 (benchmarks/README.md).
SLOWER_ALONE = 1.5
# An XLA kernel the plan leaves alone is replaced by one of ours only when, timed alone, ours
# takes at most 1/FASTER_ALONE of XLA's time: a one-for-one swap saves no memory traffic, so
# only code XLA:CPU runs badly is worth it (the argmax of Keras's accuracy metric; numbers in
# benchmarks/README.md), and a margin keeps the noise of short timings out.
FASTER_ALONE = 1.5
