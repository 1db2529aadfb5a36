"""The GPU worker (`python -m worker`): Django-free, imports dispatchlab.core only; pynvml, torch and
sglang are imported lazily inside the functions that need them.

Re-running a fixed launch and benchmarking candidate kernels on a GPU of the right architecture is the
next capability on the roadmap; this package holds what it can already do: say which GPU it is on and
which queues it would serve.
"""
