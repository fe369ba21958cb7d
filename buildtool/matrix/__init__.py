"""Stage 1: the version matrix (schema, YAML loader with lines) and the plan (names, tags, content keys)."""
