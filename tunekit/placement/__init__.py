"""Where a probe runs: device maps, node topology, GPU facts and the process group.

``gpus`` maps device-map indices to physical GPUs, ``nodes`` splits a probe's devices over machines and launches
each node's ranks, ``dist`` is a process's place in its group, ``ports`` finds free local ports.
"""
