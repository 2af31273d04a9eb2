"""Running the engine's model over tensor-parallel ranks: rank 0 starts the others
(launcher.py, or torchrun does) and each other rank serves rank 0's commands with its
own runner (rank_worker.py). It sits above worker/: a rank calls its runner's methods,
and the runner knows nothing of how its rank was started."""
