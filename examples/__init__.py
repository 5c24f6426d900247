"""Example taskq applications, importable from the repository root (`taskq worker examples.app:actors`)."""
