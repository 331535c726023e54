"""The two ways in: the pytest plugin and the command line, sharing one option table."""
