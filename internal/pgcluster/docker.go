package pgcluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

// dockerImage is the server used where only Docker is available; it matches
// the Debian packages the local path uses.
const dockerImage = "postgres:15"

// dockerReachable reports whether a Docker engine looks reachable. It checks
// for the socket rather than asking testcontainers, whose probe is slow to fail.
func dockerReachable() bool {
	if os.Getenv("DOCKER_HOST") != "" {
		return true
	}
	_, err := os.Stat("/var/run/docker.sock")
	return err == nil
}

func startDocker(ctx context.Context, opts Options) (*Cluster, error) {
	settings := baseSettings(opts)
	cmd := []string{"postgres"}
	for i := 0; i+1 < len(settings); i += 2 {
		if strings.HasPrefix(settings[i+1], "listen_addresses=") {
			continue // the container must listen on its own interface
		}
		cmd = append(cmd, settings[i], settings[i+1])
	}
	ctr, err := tcpostgres.Run(ctx, dockerImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd(cmd...),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(90*time.Second)),
	)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: docker: %w", err)
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		testcontainers.TerminateContainer(ctr)
		return nil, fmt.Errorf("pgcluster: docker: %w", err)
	}
	c := &Cluster{Kind: KindDocker, URL: u}
	c.stopFn = func() error { return testcontainers.TerminateContainer(ctr) }
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}
