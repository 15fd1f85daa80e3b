"""The feature store: Redis I/O, what a lookup fetches and how its replies parse, every
lookup of a batch in one round trip, and waiting out a store that cannot serve."""
