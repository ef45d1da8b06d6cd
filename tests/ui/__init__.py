"""Tests of the /ui/ dashboard: pages, live consumers and a real browser."""
