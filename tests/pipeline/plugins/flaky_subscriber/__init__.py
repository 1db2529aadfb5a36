"""A Django app of one's own (DISPATCHLAB_EXTRA_APPS) whose event subscriber fails twice per report,
then works: tests/pipeline/test_events.py starts a stack with it."""
