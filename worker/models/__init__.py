"""Which model a pipeline serves: loading and checking it (parts, fit), its canary and
shadow candidates, and hot reload."""
