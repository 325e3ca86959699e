"""Baseline controllers: default, max/static, reactive, ztt, oracle."""
