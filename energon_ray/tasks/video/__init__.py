"""Video tasks: ``vqa`` (uniform frames and a question → answer tokens)."""
