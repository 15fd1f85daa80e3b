"""Everything that talks to Kafka: the consumer (source), the producer (sink), the admin
client, topics, record limits, headers, client logs, transactions, lag, stalled calls and
group coverage."""
