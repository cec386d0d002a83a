"""Search strategies (agents) that drive the altenv environments."""
