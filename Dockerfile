# syntax=docker/dockerfile:1
# proxyhealth's image: the static, stripped exporter and nothing else. The exporter reads
# netfilter in its own process (netlink and the iptables-legacy socket options): it runs no
# iptables or nft binary, needs no libc, shell, CA bundle or user database.
#
# With a registry (the build stage is a golang image), for one platform or several:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) -t proxyhealth .
#
# Without one, `make image` builds the binaries on the host (make image-binaries) and hands
# them to this file in place of the build stage (--build-context build=DIR): nothing is pulled.

# The Go version of go.mod.
ARG GO_VERSION=1.26.8

# The build stage writes /out/proxyhealth (for the target platform) and /out/setfcap (for the
# build platform: it runs during the build). Replaced by a directory with the same two files
# when built with --build-context build=DIR.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS TARGETARCH
ARG VERSION=unknown
ARG REVISION=unknown
# The Makefile holds the build flags (CGO_ENABLED=0, -trimpath, -s -w, version stamping).
RUN make image-binaries OUT=/out GOOS="$TARGETOS" GOARCH="$TARGETARCH" VERSION="$VERSION" REVISION="$REVISION"

# The exporter's file capabilities, in the permitted set only (no effective bit): the image
# runs as user 9869 (the project's own; see deploy/README.md), and Kubernetes runtimes give a non-root container its capabilities in the
# permitted and bounding sets but not the ambient one, so without file capabilities they would
# be gone at exec. Without the effective bit the kernel grants at exec the file's capabilities
# that the container has and leaves out the others, and the exporter makes them effective
# itself (internal/capability): a capability the DaemonSet does not grant fails the collectors
# that need it, never the exec (with +ep the exec would fail). What each one is for:
# deploy/README.md. This stage runs on the build platform; the attribute is copied with the file.
FROM --platform=$BUILDPLATFORM scratch AS caps
COPY --from=build /out/proxyhealth /out/setfcap /
RUN ["/setfcap", "cap_net_admin,cap_net_raw,cap_dac_read_search=p", "/proxyhealth"]

FROM scratch
COPY --from=caps /proxyhealth /proxyhealth
USER 9869:9869
# No allocation sampling from the process's first allocation: the runtime's table of samples
# (1.4 MiB) is otherwise made before main runs. --web.enable-pprof turns sampling back on.
ENV GODEBUG=memprofilerate=0
EXPOSE 9869
ENTRYPOINT ["/proxyhealth"]
