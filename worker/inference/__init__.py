"""Running a model: the ONNX Runtime engine, execution providers, device I/O, batch-size
buckets, what the graph declares, the model slot a pipeline serves from, and outputs as rows."""
