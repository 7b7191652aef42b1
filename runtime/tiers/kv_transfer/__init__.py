"""Prefill/decode disaggregation: a prefill instance keeps a finished prompt's KV blocks and serves them over
TCP; a decode instance fetches them into its pool instead of recomputing the prompt (docs/disaggregation.md)."""
