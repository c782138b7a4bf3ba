# The relay as a container: a static binary (CGO_ENABLED=0) on an empty base
# image, run as a non-root user, with `relay` as the entrypoint.
#
#   docker build -t compensa/relay \
#     --build-arg VERSION="$(git describe --tags --dirty 2>/dev/null || echo dev)" \
#     --build-arg COMMIT="$(git rev-parse HEAD)" .
#   docker run --rm compensa/relay version
#
# The build stage runs the same go build as `make build` (a test in cmd/relay
# compares the two); .git is not in the build context, so the version and the
# commit come in as build arguments.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=
# -tags grpcnotrace keeps html/template out of gRPC, so the linker can drop unused methods.
RUN CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" -o bin/relay ./cmd/relay

FROM scratch
# TLS to PostgreSQL (sslmode=verify-full), brokers and webhooks needs the CA
# bundle; time zones for the logs' and the monitor's times.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /usr/share/zoneinfo /usr/share/zoneinfo
COPY --from=build /src/bin/relay /usr/local/bin/relay
ENV PATH=/usr/local/bin
# A numeric user: the image has no /etc/passwd, and Kubernetes' runAsNonRoot
# can only check a number.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/relay"]
CMD ["run"]
