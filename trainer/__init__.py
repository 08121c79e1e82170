"""The embedded trainer: one process per rank. Never imports the daemon."""
