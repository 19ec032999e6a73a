"""The ``energon-ray`` command line (one command per module)."""
