"""The `edgedyn` command line: cli/main.py wires one small module per command."""
