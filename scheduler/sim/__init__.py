"""snugfit."""
