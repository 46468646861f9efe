"""Calibrating the time model to measured runs: measurements, fit and calibration file.

`measurements` reads what a training run measured, `fit` fits the time and memory model's
coefficients to such runs (with `robust_fit`, `spread` and `memory`), and `file` is the
calibration as stored: its JSON document, read and written in one place.
"""
