// Package pgdocker starts the throwaway PostgreSQL of the tests and the bench
// where this machine has no server binaries but a Docker engine: it tries
// pgcluster.Start first and falls back to a container from testcontainers-go's
// postgres module. It belongs to the laboratory: the relay binary never links
// it (a test in cmd/relay keeps it so).
package pgdocker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/compensa/compensa/internal/pgcluster"
)

// image is the server used where only Docker is available; it matches the
// Debian packages the local path uses.
const image = "postgres:15"

// Start returns a running cluster: pgcluster.Start's sources first, then,
// when none of them exists here and a Docker engine is reachable, a
// container. Restart, Halt and standbys need a local cluster.
func Start(ctx context.Context, opts pgcluster.Options) (*pgcluster.Cluster, error) {
	c, err := pgcluster.Start(ctx, opts)
	if !errors.Is(err, pgcluster.ErrNoPostgres) || !reachable() {
		return c, err
	}
	return startContainer(ctx, opts)
}

// reachable reports whether a Docker engine looks reachable. It checks for
// the socket rather than asking testcontainers, whose probe is slow to fail.
func reachable() bool {
	if os.Getenv("DOCKER_HOST") != "" {
		return true
	}
	_, err := os.Stat("/var/run/docker.sock")
	return err == nil
}

func startContainer(ctx context.Context, opts pgcluster.Options) (*pgcluster.Cluster, error) {
	settings := pgcluster.Settings(opts)
	cmd := []string{"postgres"}
	for i := 0; i+1 < len(settings); i += 2 {
		if strings.HasPrefix(settings[i+1], "listen_addresses=") {
			continue // the container must listen on its own interface
		}
		cmd = append(cmd, settings[i], settings[i+1])
	}
	ctr, err := tcpostgres.Run(ctx, image,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd(cmd...),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(90*time.Second)),
	)
	if err != nil {
		return nil, fmt.Errorf("pgdocker: %w", err)
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		testcontainers.TerminateContainer(ctr)
		return nil, fmt.Errorf("pgdocker: %w", err)
	}
	return pgcluster.Adopt(ctx, pgcluster.KindDocker, u,
		func() error { return testcontainers.TerminateContainer(ctr) }, 60*time.Second)
}
