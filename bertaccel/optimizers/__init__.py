"""Optimizers the thesis and seeds study, one module each."""
