"""Benchmarks: `python -m distcourse.bench NAME` prints ratios against torch built-ins.

Each benchmark is a module here with a `main(argv)` function; NAME is its module name.
"""
