"""The GKD trainer: the driver, its Ray actors, the built-in task and models, the losses."""
