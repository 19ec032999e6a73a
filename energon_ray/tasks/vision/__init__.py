"""Vision tasks: ``captioning`` (image → caption tokens) and ``igpt`` (generative pixels)."""
