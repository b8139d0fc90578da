"""Memory of a step."""
