"""Test support shipped with the package: the scripted fake engine and leak checks, shared by the tests (tests/integration/test_faults.py among them) and the benchmarks."""
