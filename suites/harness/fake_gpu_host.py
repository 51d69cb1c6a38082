"""A plugin for the harness tests' child runs (``-p suites.harness.fake_gpu_host``): this host counts as a GPU host to
the rank pools and to conftest.py's grouping of the tests over pytest-xdist workers (fixtures.dist.pool.gpu_host)."""
from fixtures.dist import pool

pool.gpu_host = lambda: True
