"""The forking supervisor behind `taskq run APP --workers N` (see taskq.supervisor.main).

Importing this package imports nothing else: the supervisor must decide how metrics are set up
before anything heavy is imported.
"""
