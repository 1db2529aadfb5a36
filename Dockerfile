# One image for the dashboard's web server, CPU worker and beat (the default target), and a `gpu` target
# for the GPU worker on top of an image that brings the inference servers. Everything is installed here,
# at build time; containers only start processes (docker-compose.yml).
#
#   docker build -t dispatchlab .                                   # web, worker, beat
#   docker build --target gpu -t dispatchlab-gpu .                  # the GPU worker (GPU_BASE_IMAGE)

ARG PYTHON_IMAGE=python:3.12-slim
ARG GPU_BASE_IMAGE=lmsysorg/sglang:latest

# ---- the GPU worker: Django-free, only the broker client and NVML on top of the servers' image
FROM ${GPU_BASE_IMAGE} AS gpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY dispatchlab ./dispatchlab
COPY worker ./worker
RUN pip install --no-deps -e . && pip install 'nvidia-ml-py>=12' 'celery>=5.4' 'kombu>=5.4' 'redis>=5'
CMD ["python", "-m", "worker", "serve"]

# ---- the dashboard (default target)
FROM ${PYTHON_IMAGE} AS app
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=dispatchlab.config.settings \
    DISPATCHLAB_DATA_DIR=/data/var \
    DISPATCHLAB_MEDIA_ROOT=/data/media \
    DISPATCHLAB_STATIC_ROOT=/app/staticfiles \
    DISPATCHLAB_STATIC_MANIFEST=true
WORKDIR /app
# Dependencies first (a layer that survives code changes), then the code, installed in place: the
# settings find templates/ and static/ beside the package.
COPY pyproject.toml README.md ./
RUN mkdir -p dispatchlab worker && touch dispatchlab/__init__.py worker/__init__.py \
    && pip install '.[web]' && pip uninstall -y dispatchlab
COPY manage.py ./
COPY dispatchlab ./dispatchlab
COPY worker ./worker
COPY templates ./templates
COPY static ./static
# The secret key given here only lets collectstatic import the settings; it is not kept in the image.
# collectstatic writes the hashed, gzip and Brotli copies the web server sends (DISPATCHLAB_STATIC_MANIFEST).
RUN pip install --no-deps -e . \
    && DISPATCHLAB_SECRET_KEY=collectstatic-only DISPATCHLAB_DATA_DIR=/tmp/build \
       python manage.py collectstatic --noinput -v0 \
    && rm -rf /tmp/build \
    && useradd --system --uid 10001 --home-dir /data dispatchlab \
    && mkdir -p /data/var /data/media && chown -R dispatchlab /data
USER dispatchlab
EXPOSE 8000
# uvicorn: a client that sends its body slowly holds a coroutine, not a worker (deploy/README.md).
CMD ["uvicorn", "dispatchlab.config.asgi:application", "--host", "0.0.0.0", "--port", "8000", \
     "--workers", "4", "--timeout-keep-alive", "5", "--lifespan", "off", \
     "--http", "dispatchlab.security.deadlines:DeadlineH11Protocol", "--no-proxy-headers"]
