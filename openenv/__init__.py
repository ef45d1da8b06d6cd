"""Kiln's OpenEnv app: the pure client (`openenv.client`), and later the collector, runs and artifacts.

Our package shares its import name with the PyPI projects that serve OpenEnv environments. Kiln
speaks the wire protocol itself and never installs those packages; tests that need a real server
run it from a separate virtual environment as a separate process.
"""
