"""What the dashboard and GPU workers say to each other through the broker, Django-free.

Both sides import this package: `dispatchlab.config.settings` for the dashboard's Celery app, `worker`
for the GPU worker's. It holds the broker configuration (`broker`), the embedded filesystem transport
(`transport`) and the message contract (`contract`): task names, queues and JSON payloads.
"""
