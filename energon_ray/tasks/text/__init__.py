"""Text tasks: ``lm_packing`` (a language model on packed sequences)."""
