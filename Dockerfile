# The image the Kubernetes manifests run (deploy/k8s-*.yaml): the release `evaluate` example on slim Debian.
#   docker build -t armoury:latest .     (then push it where the cluster pulls from; see deploy/README.md)
# Build stage: the workspace, compiled with the locked dependency versions by the toolchain CI uses (rustc 1.95;
# the crates declare 1.88 as their minimum).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --example evaluate

# Run stage: the binary, and the reference weights it falls back on without --model (tests/fixtures, relative to
# the working directory). The evaluation reads and writes only the mounted volume (/data).
FROM debian:bookworm-slim
WORKDIR /armoury
COPY --from=build /src/target/release/examples/evaluate /usr/local/bin/evaluate
COPY --from=build /src/tests/fixtures/cnn.safetensors /src/tests/fixtures/mlp.safetensors tests/fixtures/
ENTRYPOINT ["/usr/local/bin/evaluate"]
