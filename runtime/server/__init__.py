"""The OpenAI-compatible HTTP layer: schemas, validation into errors, routes, the app factory."""
