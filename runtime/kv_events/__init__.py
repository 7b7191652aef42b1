"""vLLM-format KV events: the prefix cache's blocks, published over ZMQ for prefix-aware routers."""
