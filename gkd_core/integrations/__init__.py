"""Other people's jobs under the dashboard, unmodified (DESIGN §10).

A command started by ``gkd-tui launch -- COMMAND`` gets the run's addresses in its environment
(:mod:`job_env`); its processes report through the same Reporter as our trainer's: Ray jobs through
Ray's runtime-env hooks (:mod:`ray_hook`: every actor's methods, the driver's waits). It stands on
telemetry and the vocabulary only: it never imports our trainer, and the trainer never imports it.
Loaded but not asked for, it does nothing; a failure inside it is said once and never reaches the job.
"""
