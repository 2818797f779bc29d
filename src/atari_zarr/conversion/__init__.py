"""Conversion of a source run into a store: the task graph, scheduling, resume, shard encoding."""
