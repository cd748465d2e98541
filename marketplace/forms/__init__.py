"""Console forms, one module per area: a field is parsed and validated in one place."""
