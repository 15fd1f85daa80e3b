"""The worker's configuration: the typed schema, loading it with environment overrides,
redaction, and what the file system resolves (model versions)."""
