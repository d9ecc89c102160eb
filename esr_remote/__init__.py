"""Remote embedding engines (Infinity, TEI, vLLM, OpenAI) as a batcher backend: the embeddings API
client, the backend that sends each batch as one call, and the circuit breaker in front of it."""
