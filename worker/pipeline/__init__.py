"""One batch's steps: decode (codec, request shape), enrich and assemble feeds, hooks,
model calls, the canary and shadow, results and dead letters. ``Pipeline`` (steps) runs
them as three steps, one module each: prepare, infer and publish."""
