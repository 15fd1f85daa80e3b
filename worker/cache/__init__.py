"""The output cache: rows whose model inputs were seen before skip the model; its keys and
its in-process and Redis tiers."""

from __future__ import annotations

from worker.cache.output_cache import CachedRows, OutputCache, SettledRows, open_cache

__all__ = ["CachedRows", "OutputCache", "SettledRows", "open_cache"]
