"""The worker's loop: the ``Worker``, the micro-batcher, group membership, pausing,
priority lanes and the processing threads."""
