"""Defences that work on a request before a view runs: early refusals, security headers, login limits."""
