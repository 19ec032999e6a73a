"""Combining datasets: blends, concatenation, mixing, epochizing, mapping, metadataset YAML."""
