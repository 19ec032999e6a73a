"""Pure, seeded planning: who reads which samples, in which order (no I/O, no Ray)."""
