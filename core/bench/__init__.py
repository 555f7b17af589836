"""``dsahal bench``: op timings at the shapes of docs/performance.md against ceilings measured in the same process.

- :mod:`.timing`     ceilings (device copy, bf16 matmul) and the timer (median of CUDA-event runs)
- :mod:`.baselines`  the plain-torch compositions each op is compared with
- :mod:`.cases`      one case per (op, shape): inputs, a correctness check at a reduced shape, bytes, FLOPs
- :mod:`.report`     the table, JSON and the roofline plot
"""
