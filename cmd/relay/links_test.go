package main

import (
	"os/exec"
	"strings"
	"testing"
)

// labPackages are the import-path fragments of what the tests and the bench
// need and the relay never runs: container engines, in-process brokers,
// browsers, the bench itself.
var labPackages = []string{
	"github.com/testcontainers/",
	"github.com/moby/",
	"github.com/docker/",
	"github.com/twmb/franz-go/pkg/kfake",
	"github.com/nats-io/nats-server/",
	"github.com/chromedp/",
	"github.com/compensa/compensa/bench",
	"github.com/compensa/compensa/internal/pgcluster/pgdocker",
	"github.com/compensa/compensa/test/",
}

// TestRelayBinaryLinksNoLab: the relay binary's packages include none of the
// laboratory's, so a scanner run on the image reports only what the relay can
// execute. Test binaries may link them.
func TestRelayBinaryLinksNoLab(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/relay: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 50 {
		t.Fatalf("go list -deps listed %d packages: %q", len(pkgs), out)
	}
	for _, p := range pkgs {
		for _, lab := range labPackages {
			if strings.HasPrefix(p, lab) {
				t.Errorf("cmd/relay links %s: keep it in the tests or in the bench module (bench/)", p)
			}
		}
	}
}
