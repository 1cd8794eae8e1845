"""Built-in topologies."""
