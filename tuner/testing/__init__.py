"""Test support shipped with the package: the scripted fake engine and leak checks, shared by tests and scripts/fault_drill.py."""
