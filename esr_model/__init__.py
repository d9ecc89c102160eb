"""The embedding model behind the batcher: its location and ONNX export, the two runtimes (ONNX Runtime, torch), their thread count, the CPU budget."""
