"""The model process's socket: the frame codec, the server that puts a batcher on a Unix socket,
and the client front ends embed through. Knows the batcher's contract (batching), nothing else."""
