"""Riding out a database outage: which errors are outages, what the process knows of them, and the storage that rides them."""
