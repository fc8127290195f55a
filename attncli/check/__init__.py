"""Checking expected numbers: comparison rules, the precision model, the catalogue of mistakes and
the verdict. Knows nothing of files or the command line."""
