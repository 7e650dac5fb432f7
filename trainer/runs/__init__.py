"""Running a training job: the run folder, the staged job, metrics, progress and stopping."""
