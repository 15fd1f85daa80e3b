"""One batch's steps: decode (codec, request shape), enrich and assemble the model's
feeds, hooks, model calls, the canary and shadow, results and dead letters."""
