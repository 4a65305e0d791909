# syntax=docker/dockerfile:1
# SGLang's router (Rust binary shipped in the sglang-router wheel) as a small image.
#   docker build -f deploy/docker/router.Dockerfile -t sparrow-router:0.3.2 deploy/docker
FROM python:3.12-slim
ARG SGLANG_ROUTER_VERSION=0.3.2
RUN pip install --no-cache-dir "sglang-router==${SGLANG_ROUTER_VERSION}" \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin router
USER router
# 30000: the routed API (/generate, /v1/*, /workers, /health, /readiness); 29000: Prometheus metrics.
EXPOSE 30000 29000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:30000/liveness', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["python", "-m", "sglang_router.launch_router"]
CMD ["--host", "0.0.0.0", "--port", "30000", "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000"]
