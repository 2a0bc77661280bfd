# valruns: one image, one binary, several processes (serve, worker, migrate, cleanup...).
#   docker build -t valruns .
# docker-compose.yml runs the whole stack (PostgreSQL, Redis, migrations, API, worker).

# ---- build ------------------------------------------------------------------------------
FROM golang:1.26-bookworm AS build
WORKDIR /src
# go.mod asks for a newer patch release than the image may carry: let the go command fetch it.
ENV GOTOOLCHAIN=auto
# Dependencies first, in their own layer: rebuilt only when go.mod/go.sum change.
# The Go client is a module of its own that go.mod replaces with ./client: its
# go.mod must be there for go mod download (it has no go.sum: no dependency).
COPY go.mod go.sum ./
COPY client/go.mod client/
RUN go mod download && go mod verify
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/valruns .

# ---- runtime ----------------------------------------------------------------------------
# debian-slim rather than distroless so that the healthchecks have curl.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin valruns
COPY --from=build /out/valruns /valruns
USER 10001:10001
ENV HTTP_ADDR=:8080 \
    LOG_FORMAT=json
EXPOSE 8080
# No HEALTHCHECK here: the same image runs the worker and one-shot commands;
# docker-compose.yml declares one per service.
ENTRYPOINT ["/valruns"]
CMD ["serve"]
