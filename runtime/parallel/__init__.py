"""Tensor parallelism over torch.distributed (gloo on the CPU, NCCL on CUDA).

The engine process is rank 0: it schedules, runs its own shard and alone samples. Ranks 1..N-1 are
spawned worker processes that each hold 1/N of the weights and the KV heads of their query heads,
receive every step's chunks in one broadcast and run the same forward (plan.py: who holds what;
shard.py: the checkpoint cut per rank; layers.py: the collectives inside the model; group.py: the
process groups the engine holds; worker.py: a worker's loop; runner.py: rank 0's runner, failures and shutdown).
"""
