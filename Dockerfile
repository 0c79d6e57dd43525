# syntax=docker/dockerfile:1
# tollgate's container image: the release build (`cargo build --release
# --locked`, as the README's "Deploy" section documents) on a minimal
# non-root base holding the binary alone.
#
#   docker build -t registry.example.com/tollgate:0.1.0 .

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them all.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
RUN mkdir -p src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked --bin tollgate \
    && rm -rf src
COPY src ./src
COPY lua ./lua
# The placeholder build left a stale binary: make sure the real one is built.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin tollgate \
    && cp target/release/tollgate /tollgate

# glibc and CA certificates (for rediss:// with the system roots), no shell,
# user 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /tollgate /usr/local/bin/tollgate
USER 65532:65532
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve"]
