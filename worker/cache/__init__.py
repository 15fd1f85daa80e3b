"""The output cache: rows whose model inputs were seen before skip the model; its keys and
its in-process and Redis tiers."""
