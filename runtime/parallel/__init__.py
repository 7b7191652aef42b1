"""Model parallelism over torch.distributed (gloo on the CPU, NCCL on CUDA): tensor parallelism (TP) and
pipeline parallelism (PP), composable, the ranks spawned on this machine or started by a launcher
(torchrun) on any node.

The engine process is rank 0: it schedules, runs its own part and alone samples. The other ranks each
hold their stage's layers and, within the stage, 1/TP of the weights and of the KV heads; they receive
every step's chunks in one broadcast and run the same forward (plan.py: who holds what; shard.py: the
checkpoint cut per rank; layers.py: the TP collectives inside the model; pipeline.py: a stage's part of a
step, micro-batches and point-to-point sends; group.py: the process groups and where the ranks meet;
worker.py: a worker's build and loop; launch.py: a launcher's environment; runner.py: rank 0's runner,
failures and shutdown).
"""
