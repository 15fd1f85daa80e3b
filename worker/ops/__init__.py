"""Running the worker in production: metrics, merged metrics, health, logs and the
process supervisor."""
