"""The embedding model behind the batcher: the sentence-transformers encoder, its torch thread count, the CPU budget."""
