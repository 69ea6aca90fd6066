# syntax=docker/dockerfile:1
# proxyhealth's image: the exporter built exactly as `make build` builds it, on Debian with the
# iptables (legacy and nft) and nftables binaries its collectors run.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t proxyhealth .

# The Go version of go.mod.
ARG GO_VERSION=1.26.8

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS TARGETARCH
ARG VERSION=unknown
ARG REVISION=unknown
# The Makefile holds the build flags (CGO_ENABLED=0, -trimpath, version stamping); CI tests the
# binary those flags make.
RUN GOOS=$TARGETOS GOARCH=$TARGETARCH make build VERSION="$VERSION" REVISION="$REVISION"

FROM debian:bookworm-slim
COPY --from=build /src/proxyhealth /usr/local/bin/proxyhealth
# The process runs as user 65534 with the capabilities the DaemonSet adds (deploy/base). Kubernetes
# runtimes give a non-root container its added capabilities in the bounding and permitted sets
# but not the ambient set, so they survive exec only as file capabilities: on the exporter and
# on the binaries it runs. With allowPrivilegeEscalation: false no binary gets more than the
# container was given. Each file needs every capability listed here in the container's set, or
# it fails to exec. test/e2e/deploy_caps_test.go applies these same lines in the lab.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables libcap2-bin \
 && setcap cap_net_admin,cap_net_raw,cap_dac_read_search+ep /usr/local/bin/proxyhealth \
 && setcap cap_net_admin,cap_net_raw+ep /usr/sbin/xtables-legacy-multi \
 && setcap cap_net_admin+ep /usr/sbin/xtables-nft-multi \
 && setcap cap_net_admin+ep /usr/sbin/nft \
 && apt-get purge -y libcap2-bin \
 && apt-get autoremove -y \
 && rm -rf /var/lib/apt/lists/*
USER 65534:65534
EXPOSE 9869
ENTRYPOINT ["/usr/local/bin/proxyhealth"]
