# stormglass in a container: built with the workspace's locked dependencies, run as a
# non-root user on a slim Debian. Ports: 4317 OTLP/gRPC, 4318 OTLP/HTTP, 9464 the page,
# /metrics, /api/v1/*, /healthz (liveness) and /readyz (readiness: 503 while the memory
# budget is full and exporters are told to retry).
#   docker build -t stormglass .
#   docker run -p 4317:4317 -p 4318:4318 -p 9464:9464 -m 1280m stormglass
# limits.memory defaults to 80% of the container's memory limit (-m), which the process
# stays within ~15% of (docs/operating.md).

FROM rust:1.94-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p stormglass \
    && install -D target/release/stormglass /out/stormglass

FROM debian:bookworm-slim
# The system roots the alert notifiers trust for https:// receivers.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/stormglass /usr/local/bin/stormglass
RUN useradd --system --uid 10001 --home-dir /var/lib/stormglass --create-home stormglass
USER 10001
WORKDIR /var/lib/stormglass
# Listen on every interface inside the container (the defaults are loopback only).
ENV STORMGLASS_LISTEN__GRPC=0.0.0.0:4317 \
    STORMGLASS_LISTEN__HTTP=0.0.0.0:4318 \
    STORMGLASS_LISTEN__API=0.0.0.0:9464
EXPOSE 4317 4318 9464
ENTRYPOINT ["/usr/local/bin/stormglass"]
CMD ["serve"]
