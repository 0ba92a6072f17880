"""What a configuration costs, before and after it runs.

``profiles`` holds the GPU price profiles, ``cost`` prices a probe and a full run, ``step_times`` says which step
times a projection reads, ``memory`` is the memory verdict, ``costmodel`` predicts step time on GPUs a recipe never
ran on, and ``views`` projects a recipe's full run from earlier probes or the cost model.
"""
