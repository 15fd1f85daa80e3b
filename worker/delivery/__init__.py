"""How a batch's results become durable and its offsets committed: the delivery mode
Protocol, at-least-once, exactly-once and the committer."""
