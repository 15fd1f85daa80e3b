"""The plain records and types every layer uses: a batch in flight (``Job``), its delivery
tracker, partition keys, the injected clock. Nothing here imports another worker module."""
