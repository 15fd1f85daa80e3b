"""The output cache: rows whose model inputs were seen before skip the model; its keys and
its in-process and Redis tiers, and its metrics."""

from __future__ import annotations

from worker.cache.metrics import CacheFamilies
from worker.cache.output_cache import CachedRows, OutputCache, SettledRows, open_cache

__all__ = ["CacheFamilies", "CachedRows", "OutputCache", "SettledRows", "open_cache"]
