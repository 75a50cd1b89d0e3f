"""The environment: tasks, actions, checks, suites, episodes, and running a task on the Policy / ToolBackend protocols."""
