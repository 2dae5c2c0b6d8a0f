# torchtitan's own test file is run by test_torchtitan_suite.py in a pytest process of its own
# (with otel_titan.compat.torchtitan installed there), never collected by this suite's process.
collect_ignore_glob = ["data/*"]
