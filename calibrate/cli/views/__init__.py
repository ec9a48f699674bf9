"""Renderers: a stage's result as rich tables, text lines and JUnit."""
