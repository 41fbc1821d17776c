"""Study-specific settings, published numbers and verdicts, one module per paper."""
