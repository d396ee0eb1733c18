"""Jobs and the scheduler: lifecycle events to the scheduler backend, job slots."""
