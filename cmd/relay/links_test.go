package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compensa/compensa/test/testkit"
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

// TestRelayBinaryKeepsDeadCodeElimination: the release binary links no
// function that looks a method up by name through reflection. One such
// function, reachable from main (text/template's field evaluation, behind
// any html/template or text/template Execute; reflect.Value.MethodByName
// with a name not known at compile time), makes the linker keep every
// exported method of every type the relay links: about 13 MB of the
// stripped binary. The relay is built as `make build` builds it (the
// Makefile's command, -tags grpcnotrace included), with the linker's
// dependency dump added, and the test names the chain of calls from main to
// each such function.
func TestRelayBinaryKeepsDeadCodeElimination(t *testing.T) {
	testkit.SkipShort(t, "builds the release binary with the linker's dependency dump (about 40 s)")
	t.Parallel()
	mk, _ := makeBuild(t)
	words := shellWords(os.Expand(mk, func(name string) string {
		if name == "VERSION" {
			return "dev"
		}
		return ""
	}))
	var env []string
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		env, words = append(env, words[0]), words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		t.Fatalf("make build runs %q, want go build", mk)
	}
	out := filepath.Join(t.TempDir(), "relay")
	args, ldflags := []string{"build"}, false
	for i := 2; i < len(words); i++ {
		switch w := words[i]; {
		case w == "-ldflags" && i+1 < len(words):
			args, ldflags = append(args, w, words[i+1]+" -dumpdep"), true
			i++
		case w == "-o" && i+1 < len(words):
			args = append(args, w, out)
			i++
		default:
			args = append(args, w)
		}
	}
	if !ldflags {
		args = append(args[:1], append([]string{"-ldflags=-dumpdep"}, args[1:]...)...)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), env...)
	var dump bytes.Buffer
	cmd.Stdout, cmd.Stderr = &dump, &dump
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s: %v\n%.2000s", strings.Join(args, " "), err, dump.String())
	}
	parent, reflective := linkerDeps(dump.String())
	if _, ok := parent["main.main"]; !ok || len(parent) < 10000 {
		t.Fatalf("the linker's dependency dump names %d symbols and main.main %t: has its format changed?\n%.2000s", len(parent), ok, dump.String())
	}
	if len(reflective) == 0 {
		return
	}
	// Functions of package reflect are named without their chain when
	// others are there: they are reached because the linker, once it has
	// seen one such function, keeps every exported method (reflect.Value's
	// too); the others are the cause.
	var causes, consequences []string
	for _, sym := range reflective {
		if strings.HasPrefix(sym, "reflect.") {
			consequences = append(consequences, sym)
		} else {
			causes = append(causes, sym)
		}
	}
	if len(causes) == 0 {
		causes, consequences = consequences, nil
	}
	var msg strings.Builder
	fmt.Fprintf(&msg, "the relay links %d functions that look methods up by name through reflection, so the linker keeps every exported method of every linked type (about 13 MB); render with templ, not html/template or text/template, and keep gRPC's grpcnotrace tag:", len(reflective))
	for i, sym := range causes {
		if i == 3 {
			consequences = slices.Concat(causes[i:], consequences)
			break
		}
		fmt.Fprintf(&msg, "\n\n%s, reached by\n\t%s", sym, strings.Join(linkerChain(parent, sym), "\n\t-> "))
	}
	if len(consequences) > 0 {
		fmt.Fprintf(&msg, "\n\nand %s", strings.Join(consequences, ", "))
	}
	t.Error(msg.String())
}

// linkerDeps reads the linker's -dumpdep output: each line "from -> to"
// marks to as reachable, first from its parent (the root is "_"), with
// flags such as <ReflectMethod> after a symbol's name. It returns each
// symbol's parent and the symbols flagged <ReflectMethod>.
func linkerDeps(dump string) (parent map[string]string, reflective []string) {
	parent = map[string]string{}
	seen := map[string]bool{}
	name := func(s string) string {
		i := strings.LastIndex(s, " <")
		if i < 0 || !strings.HasSuffix(s, ">") || strings.Trim(s[i+1:], "<>ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != "" {
			return s
		}
		if strings.Contains(s[i:], "<ReflectMethod>") && !seen[s[:i]] {
			seen[s[:i]] = true
			reflective = append(reflective, s[:i])
		}
		return s[:i]
	}
	for line := range strings.Lines(dump) {
		from, to, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " -> ")
		if !ok {
			continue
		}
		from, to = name(from), name(to)
		if _, dup := parent[to]; !dup {
			parent[to] = from
		}
	}
	return parent, reflective
}

// linkerChain is how the linker reached sym: from main.main when the chain
// passes through it, else from the root.
func linkerChain(parent map[string]string, sym string) []string {
	var chain []string
	for s, n := sym, 0; s != "" && s != "_" && n < 10000; s, n = parent[s], n+1 {
		chain = append(chain, s)
		if s == "main.main" {
			break
		}
	}
	slices.Reverse(chain)
	return chain
}
