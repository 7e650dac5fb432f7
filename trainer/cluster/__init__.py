"""Scale-out pieces of the trainer: in-memory weight sync to the engines and the Ray backend."""
