"""The Ray pool on a real multi-node Ray cluster on this machine, inside a network namespace
where loopback is the only interface (`test_namespace.py` starts them there)."""
