package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/compensa/compensa/internal/pgcluster"
	"github.com/compensa/compensa/internal/pgcluster/pgdocker"
	"github.com/compensa/compensa/test/testkit"
)

// The files of deploy/ and the Dockerfile are checked against this binary:
// the commands, flags and environment variables they use exist, the probes
// hit routes the monitor serves on the port it listens on, and the image is
// built by the same go build as `make build`.

const relayImage = "compensa/relay"

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	file string
	node yaml.Node
}

type k8sWorkload struct {
	Spec struct {
		Replicas *int `yaml:"replicas"`
		// A Job's: how long a finished Job is kept.
		TTLSecondsAfterFinished *int `yaml:"ttlSecondsAfterFinished"`
		Selector                struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPod `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sPod struct {
	TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
	Containers                    []k8sContainer `yaml:"containers"`
	InitContainers                []k8sContainer `yaml:"initContainers"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port's name
	} `yaml:"httpGet"`
}

type k8sService struct {
	Spec struct {
		SessionAffinity string            `yaml:"sessionAffinity"`
		Selector        map[string]string `yaml:"selector"`
		Ports           []struct {
			Port       int `yaml:"port"`
			TargetPort any `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

// manifests reads every object of deploy/kubernetes.
func manifests(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes (%v)", err)
	}
	var out []k8sObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o.node); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if err := o.node.Decode(&o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: an object without kind or metadata.name", f)
			}
			o.file = filepath.Base(f)
			out = append(out, o)
		}
	}
	return out
}

// relayContainer is a relay container of a workload, with the command its
// arguments select (parsed by the CLI itself).
type relayContainer struct {
	where    string
	kind     string
	name     string
	workload k8sWorkload
	c        k8sContainer
}

func relayContainers(t *testing.T, objs []k8sObject) []relayContainer {
	t.Helper()
	var out []relayContainer
	for _, o := range objs {
		if o.Kind != "Deployment" && o.Kind != "Job" && o.Kind != "StatefulSet" {
			continue
		}
		var w k8sWorkload
		if err := o.node.Decode(&w); err != nil {
			t.Fatalf("%s %s: %v", o.file, o.Metadata.Name, err)
		}
		for _, c := range slices.Concat(w.Spec.Template.Spec.InitContainers, w.Spec.Template.Spec.Containers) {
			if strings.HasPrefix(c.Image, relayImage+":") || c.Image == relayImage {
				out = append(out, relayContainer{where: fmt.Sprintf("%s: %s %s, container %s", o.file, o.Kind, o.Metadata.Name, c.Name), kind: o.Kind, name: o.Metadata.Name, workload: w, c: c})
			}
		}
	}
	return out
}

// envNames are the environment variables the relay reads for command c:
// RELAY_<FLAG> for each of its flags, and DATABASE_URL.
func envNames(c *cobra.Command) map[string]bool {
	names := map[string]bool{}
	add := func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		names["RELAY_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))] = true
		if f.Name == "database-url" {
			names["DATABASE_URL"] = true
		}
	}
	c.Flags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	return names
}

// secretStandIns are the values a test gives the Secret's keys: a DSN that
// parses and a token strong enough for --api-token.
func secretStandIn(key string) string {
	if strings.Contains(key, "database-url") {
		return "postgres://relay:secret@db.example:5432/app"
	}
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// parsed runs the CLI (every command's action replaced, see cliTree) on
// args with env set, and returns the command they select with its flags
// resolved from the arguments and the environment, as `relay` would.
func parsed(t *testing.T, what string, args []string, env map[string]string) *cobra.Command {
	t.Helper()
	clearRelayEnv(t)
	for k, v := range env {
		t.Setenv(k, v)
	}
	root, opts := cliTree()
	var stderr, stdout bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	var ran *cobra.Command
	walk(root, func(c *cobra.Command) {
		if c.RunE != nil {
			c.RunE = func(c *cobra.Command, _ []string) error { ran = c; return errRan }
		}
	})
	code := execute(context.Background(), root, opts, args, &stderr)
	if ran == nil || code != 1 || !strings.Contains(stderr.String(), errRan.Error()) {
		t.Fatalf("%s: relay %s: exit %d, %s; want the command to accept its arguments and environment", what, strings.Join(args, " "), code, strings.TrimSpace(stderr.String()))
	}
	return ran
}

func (rc relayContainer) env() map[string]string { return rc.envWith(secretStandIn) }

// envWith is the container's environment with secret(key) for the value of
// each Secret key it names.
func (rc relayContainer) envWith(secret func(key string) string) map[string]string {
	env := map[string]string{}
	for _, e := range rc.c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = secret(e.ValueFrom.SecretKeyRef.Key)
		default:
			env[e.Name] = e.Value
		}
	}
	return env
}

func TestKubernetesManifestsMatchTheBinary(t *testing.T) {
	objs := manifests(t)
	rcs := relayContainers(t, objs)
	if len(rcs) == 0 {
		t.Fatal("no container runs the image " + relayImage)
	}
	var sidecar, replicated bool
	tags := map[string]bool{}
	for _, rc := range rcs {
		c := rc.c
		tags[c.Image] = true
		if len(c.Command) > 0 {
			t.Errorf("%s: command %q overrides the image's entrypoint (relay): give only args", rc.where, c.Command)
		}
		cmd := parsed(t, rc.where, c.Args, rc.env())
		names := envNames(cmd)
		for _, e := range c.Env {
			if !names[e.Name] {
				t.Errorf("%s: env %s is not read by relay %s (it reads RELAY_<FLAG> for its flags, and DATABASE_URL)", rc.where, e.Name, cmd.Name())
			}
			if (strings.HasSuffix(e.Name, "DATABASE_URL") || e.Name == "RELAY_API_TOKEN") && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
				t.Errorf("%s: env %s must come from a Secret (valueFrom.secretKeyRef), not a literal value", rc.where, e.Name)
			}
		}
		if cmd.Flag("database-url").Value.String() == "" {
			t.Errorf("%s: no database URL (RELAY_DATABASE_URL from a Secret)", rc.where)
		}
		if c.Resources.Requests["memory"] == "" || c.Resources.Requests["cpu"] == "" || c.Resources.Limits["memory"] == "" {
			t.Errorf("%s: resources must request cpu and memory and limit memory", rc.where)
		}
		// The image a release publishes: compensa/relay:VERSION.
		tag, ok := strings.CutPrefix(c.Image, relayImage+":")
		if !ok || !releaseTag.MatchString(tag) {
			t.Errorf("%s: image %q: name a release, %s:X.Y.Z (docs: Deploying); nothing publishes :latest", rc.where, c.Image, relayImage)
		}
		if rc.kind == "Job" {
			checkMigrateJob(t, rc, cmd, tag)
		}
		if cmd.Name() != "run" {
			continue
		}
		// relay run: the probes reach --probe-addr's listener when one is
		// set, else the monitor on --http-addr.
		addr := cmd.Flag("http-addr").Value.String()
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%s: --http-addr %q: %v", rc.where, addr, err)
		}
		if host == "" || net.ParseIP(host).IsLoopback() || host == "localhost" {
			t.Errorf("%s: --http-addr %s: the kubelet probes the pod's address, so the monitor must listen on it (0.0.0.0)", rc.where, addr)
		}
		if cmd.Flag("api-token").Value.String() == "" {
			t.Errorf("%s: a monitor on %s needs an API token", rc.where, addr)
		}
		probeAddr := addr
		if pa := cmd.Flag("probe-addr").Value.String(); pa != "" {
			probeAddr = pa
			if host, port, err = net.SplitHostPort(pa); err != nil {
				t.Fatalf("%s: --probe-addr %q: %v", rc.where, pa, err)
			}
			if host == "" || net.ParseIP(host).IsLoopback() || host == "localhost" {
				t.Errorf("%s: --probe-addr %s: the kubelet probes the pod's address, so the probe listener must listen on it (0.0.0.0)", rc.where, pa)
			}
		}
		inAppPod := len(rc.workload.Spec.Template.Spec.Containers) > 1
		probes := []struct {
			name  string
			probe *k8sProbe
			path  string
		}{{"livenessProbe", c.LivenessProbe, "/healthz"}}
		if inAppPod {
			// A pod is ready when every container is: a relay readiness
			// probe would take the application out of its Service during a
			// database outage or a stalled stream.
			if c.ReadinessProbe != nil {
				t.Errorf("%s: a readinessProbe on the relay sidecar gates the application's readiness on the relay; give it only a livenessProbe (its health reaches people through alerts)", rc.where)
			}
			// A container is not ready before its startup probe passes.
			if c.StartupProbe != nil {
				t.Errorf("%s: a startupProbe on the relay sidecar holds the application's readiness until the relay starts; give it only a livenessProbe", rc.where)
			}
		} else {
			probes = append(probes, struct {
				name  string
				probe *k8sProbe
				path  string
			}{"readinessProbe", c.ReadinessProbe, "/readyz"})
		}
		for _, p := range probes {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: no %s.httpGet", rc.where, p.name)
				continue
			}
			if p.probe.HTTPGet.Path != p.path {
				t.Errorf("%s: %s path %q, want %s", rc.where, p.name, p.probe.HTTPGet.Path, p.path)
			}
			if got := containerPort(c, p.probe.HTTPGet.Port); strconv.Itoa(got) != port {
				t.Errorf("%s: %s port %v is container port %d, but the probes are served on %s", rc.where, p.name, p.probe.HTTPGet.Port, got, probeAddr)
			}
		}
		stop, _ := time.ParseDuration(cmd.Flag("stop-timeout").Value.String())
		if g := rc.workload.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= stop {
			t.Errorf("%s: terminationGracePeriodSeconds must exceed --stop-timeout (%s), or a graceful stop is cut short", rc.where, stop)
		}
		if inAppPod {
			sidecar = true
		}
		if r := rc.workload.Spec.Replicas; r != nil && *r >= 2 && cmd.Flag("no-stream").Value.String() == "false" {
			replicated = true
		}
	}
	if len(tags) > 1 {
		t.Errorf("the manifests name %d different relay images %v: a release deploys one version everywhere", len(tags), slices.Sorted(maps.Keys(tags)))
	}
	if !sidecar {
		t.Error("no manifest runs relay run as a sidecar next to an application container")
	}
	if !replicated {
		t.Error("no manifest runs two or more replicas of relay run (one streams, the others wait and run steps)")
	}

	// A Service reaches a relay's monitor by a port the container has.
	for _, o := range objs {
		if o.Kind != "Service" {
			continue
		}
		var s k8sService
		if err := o.node.Decode(&s); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, rc := range rcs {
			if !matches(s.Spec.Selector, rc.workload.Spec.Template.Metadata.Labels) {
				continue
			}
			found = true
			// The page's login sessions live in the process that made them
			// (a Service of the metrics alone serves no page).
			page := false
			for _, p := range s.Spec.Ports {
				page = page || fmt.Sprint(p.TargetPort) == "monitor"
			}
			if r := rc.workload.Spec.Replicas; page && r != nil && *r >= 2 && s.Spec.SessionAffinity != "ClientIP" {
				t.Errorf("%s: Service %s balances %d replicas whose page sessions live in one process each; set sessionAffinity: ClientIP (or serve the page from one replica)", o.file, o.Metadata.Name, *r)
			}
			for _, p := range s.Spec.Ports {
				if containerPort(rc.c, p.TargetPort) == 0 {
					t.Errorf("%s: Service %s targetPort %v is not a port of %s", o.file, o.Metadata.Name, p.TargetPort, rc.where)
				}
			}
		}
		if !found {
			t.Errorf("%s: Service %s selects no relay pod", o.file, o.Metadata.Name)
		}
	}
}

// releaseTag is the tag scheme of the published image: the release's
// version, without the v of its git tag.
var releaseTag = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$`)

// checkMigrateJob: the Job that migrates on each release grants the relay's
// role what relay run needs, and can be applied again by the next release
// (its name carries the release; a finished one does not linger).
func checkMigrateJob(t *testing.T, rc relayContainer, cmd *cobra.Command, tag string) {
	t.Helper()
	if cmd.Name() != "migrate" {
		return
	}
	if cmd.Flag("grant-to").Value.String() == "[]" || cmd.Flag("grant-to").Value.String() == "" {
		t.Errorf("%s: relay migrate without --grant-to: on a fresh database relay run as its own role then lacks every privilege; pass --grant-to=ROLE", rc.where)
	}
	if want := "-" + strings.NewReplacer(".", "-", "+", "-").Replace(tag); !strings.HasSuffix(rc.name, want) {
		t.Errorf("%s: Job name %q does not carry the release (want a name ending in %q): a Job's pod template is immutable, so the next release cannot apply it again", rc.where, rc.name, want)
	}
	if rc.workload.Spec.TTLSecondsAfterFinished == nil {
		t.Errorf("%s: no ttlSecondsAfterFinished: finished migrate Jobs pile up, one per release", rc.where)
	}
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a probe's or a Service's port (a number or a
// name) to the container's port number; 0 when it names none.
func containerPort(c k8sContainer, port any) int {
	for _, p := range c.Ports {
		switch v := port.(type) {
		case int:
			if v == p.ContainerPort {
				return v
			}
		case string:
			if v == p.Name {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// TestKubernetesProbesAnswerOnARealRelay plays a release on a fresh
// database as the manifests describe it: the migrate Job runs as the schema
// owner, then each relay run container (its args and env, the Secret's
// values standing in, its ports moved to free ones) runs as the relay's own
// role, and its probes must answer 200.
func TestKubernetesProbesAnswerOnARealRelay(t *testing.T) {
	testkit.SkipShort(t, "starts a relay of its own on a cluster of its own")
	rcs := relayContainers(t, manifests(t))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := pgdocker.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() { c.Stop() })
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The relay's role, created once by the operator (README, Quickstart on
	// an existing database); the Job grants it the rest.
	if _, err := conn.Exec(ctx, "CREATE ROLE relay LOGIN REPLICATION PASSWORD 'relay-secret'"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	relayURL, err := urlWithUser(c.URL, "relay", "relay-secret")
	if err != nil {
		t.Fatal(err)
	}
	secretValue := func(key string) string {
		if key == "owner-database-url" {
			return c.URL
		}
		if strings.Contains(key, "database-url") {
			return relayURL
		}
		return secretStandIn(key)
	}

	jobs := 0
	for _, rc := range rcs {
		if rc.kind != "Job" {
			continue
		}
		jobs++
		env := rc.envWith(secretValue)
		useEnv(t, env)
		var stderr bytes.Buffer
		opts := &rootOptions{}
		root := newRootCmd(opts)
		root.SetOut(io.Discard)
		root.SetErr(&stderr)
		if code := execute(ctx, root, opts, rc.c.Args, &stderr); code != 0 {
			t.Fatalf("%s: relay %s exited %d: %s", rc.where, strings.Join(rc.c.Args, " "), code, stderr.String())
		}
	}
	if jobs == 0 {
		t.Fatal("no Job runs the relay image: nothing migrates the schema on a release")
	}

	ran := 0
	for _, rc := range rcs {
		if len(rc.c.Args) == 0 || rc.c.Args[0] != "run" {
			continue
		}
		ran++
		env := rc.envWith(secretValue)
		// The same flags, on free ports; the hosts stay as written.
		ports := map[string]int{}
		for _, flag := range []string{"http-addr", "probe-addr", "metrics-addr"} {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ports[flag] = ln.Addr().(*net.TCPAddr).Port
			ln.Close()
		}
		written := map[string]string{} // flag → the address as written
		args := []string{}
		for i := 0; i < len(rc.c.Args); i++ {
			a := rc.c.Args[i]
			for flag, port := range ports {
				switch {
				case strings.HasPrefix(a, "--"+flag+"="):
					written[flag] = strings.TrimPrefix(a, "--"+flag+"=")
					a = "--" + flag + "=" + movePort(written[flag], port)
				case a == "--"+flag && i+1 < len(rc.c.Args):
					i++
					written[flag] = rc.c.Args[i]
					a = "--" + flag + "=" + movePort(rc.c.Args[i], port)
				}
			}
			args = append(args, a)
		}
		for flag, port := range ports {
			k := "RELAY_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
			if v, ok := env[k]; ok {
				written[flag] = v
				env[k] = movePort(v, port)
			}
		}
		useEnv(t, env)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan int, 1)
		var stderr bytes.Buffer
		go func() {
			opts := &rootOptions{}
			root := newRootCmd(opts)
			root.SetOut(io.Discard)
			root.SetErr(&stderr)
			done <- execute(runCtx, root, opts, append(args, "--log-level", "error"), &stderr)
		}()
		// A probe's container port is the written port of one of the two
		// listeners; it is sent to that listener's moved port.
		portOf := func(p *k8sProbe) int {
			cp := containerPort(rc.c, p.HTTPGet.Port)
			for flag, addr := range written {
				if _, wp, err := net.SplitHostPort(addr); err == nil && wp == strconv.Itoa(cp) {
					return ports[flag]
				}
			}
			return 0
		}
		for _, p := range []*k8sProbe{rc.c.LivenessProbe, rc.c.ReadinessProbe} {
			if p == nil {
				continue
			}
			if p.HTTPGet == nil {
				stop()
				t.Fatalf("%s: a probe without httpGet", rc.where)
			}
			port := portOf(p)
			if port == 0 {
				stop()
				t.Fatalf("%s: probe %s on port %v, which neither --http-addr nor --probe-addr listens on", rc.where, p.HTTPGet.Path, p.HTTPGet.Port)
			}
			url := "http://127.0.0.1:" + strconv.Itoa(port) + p.HTTPGet.Path
			deadline := time.Now().Add(90 * time.Second)
			for {
				res, err := http.Get(url)
				if err == nil {
					res.Body.Close()
					if res.StatusCode == http.StatusOK {
						break
					}
					err = fmt.Errorf("status %d", res.StatusCode)
				}
				select {
				case code := <-done:
					stop()
					t.Fatalf("%s: relay %s exited %d before %s answered: %s", rc.where, strings.Join(args, " "), code, p.HTTPGet.Path, stderr.String())
				default:
				}
				if time.Now().After(deadline) {
					stop()
					t.Fatalf("%s: %s did not answer 200 within 90s: %v", rc.where, url, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		// With --metrics-addr, /metrics answers there and not on the
		// monitor.
		if _, ok := written["metrics-addr"]; ok {
			for port, want := range map[int]int{ports["metrics-addr"]: http.StatusOK, ports["http-addr"]: http.StatusNotFound} {
				res, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
				if err != nil {
					stop()
					t.Fatalf("%s: /metrics on port %d: %v", rc.where, port, err)
				}
				res.Body.Close()
				if res.StatusCode != want {
					t.Errorf("%s: /metrics on port %d answered %d, want %d", rc.where, port, res.StatusCode, want)
				}
			}
		}
		stop()
		if code := <-done; code != 0 {
			t.Errorf("%s: relay run stopped with exit %d: %s", rc.where, code, stderr.String())
		}
	}
	if ran < 2 {
		t.Fatalf("%d relay run containers probed, want the sidecar's and the standalone one's", ran)
	}
}

// useEnv replaces the RELAY_ variables of the test's environment with env.
func useEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "RELAY_") && k != pgcluster.EnvURL {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// urlWithUser is dsn (a postgres:// URL) connecting as user with password.
func urlWithUser(dsn, user, password string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}

func movePort(addr string, port int) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// shellWords splits a command line as a POSIX shell would for the simple
// quoting the Makefile and the Dockerfile use (double and single quotes).
func shellWords(s string) []string {
	var out []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

var (
	makeVar   = regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	dockerVar = regexp.MustCompile(`\$\{([A-Z_]+)\}|\$([A-Z_]+)`)
)

// makeBuild is the go build command of the Makefile's build target, with
// $(GO) as go and the other variables as ${NAME}.
func makeBuild(t *testing.T) (cmd string, vars map[string]bool) {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	vars = map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	inBuild := false
	for sc.Scan() {
		line := sc.Text()
		if m := regexp.MustCompile(`^([A-Z_]+) \?=`).FindStringSubmatch(line); m != nil {
			vars[m[1]] = true
		}
		switch {
		case strings.HasPrefix(line, "build:"):
			inBuild = true
		case inBuild && strings.HasPrefix(line, "\t"):
			if strings.Contains(line, " build ") && cmd == "" {
				cmd = makeVar.ReplaceAllStringFunc(strings.TrimSpace(line), func(v string) string {
					name := makeVar.FindStringSubmatch(v)[1]
					if name == "GO" {
						return "go"
					}
					return "${" + name + "}"
				})
			}
		case inBuild:
			inBuild = false
		}
	}
	if cmd == "" {
		t.Fatal("the Makefile's build target runs no go build")
	}
	return cmd, vars
}

func TestDockerfileBuildsLikeMakeBuild(t *testing.T) {
	mk, mkVars := makeBuild(t)
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var (
		stages   []string // FROM lines
		args     = map[string]bool{}
		run      string
		user     string
		entry    string
		copyBin  string
		lastFrom string
	)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			stages = append(stages, line)
			lastFrom = line
		case "ARG":
			name, _, _ := strings.Cut(f[1], "=")
			args[name] = true
		case "RUN":
			if strings.Contains(line, "go build") {
				run = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), f[0]))
			}
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			entry = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), f[0]))
		case "COPY":
			if strings.Contains(line, "--from=") && strings.Contains(line, "bin/relay") {
				copyBin = line
			}
		}
	}
	if len(stages) < 2 {
		t.Fatalf("the Dockerfile has %d stages, want a build stage and a runtime stage", len(stages))
	}
	if run == "" {
		t.Fatal("the Dockerfile's build stage runs no go build")
	}
	got := dockerVar.ReplaceAllStringFunc(run, func(v string) string {
		m := dockerVar.FindStringSubmatch(v)
		return "${" + m[1] + m[2] + "}"
	})
	if !slices.Equal(shellWords(got), shellWords(mk)) {
		t.Errorf("the Dockerfile builds with\n\t%s\nbut make build with\n\t%s", got, mk)
	}
	if !strings.Contains(mk, "CGO_ENABLED=0") {
		t.Errorf("make build (%s) does not build a static binary (CGO_ENABLED=0)", mk)
	}
	for _, m := range dockerVar.FindAllStringSubmatch(got, -1) {
		name := m[1]
		if !args[name] {
			t.Errorf("the Dockerfile's go build uses ${%s} but declares no ARG %s", name, name)
		}
		if !mkVars[name] {
			t.Errorf("the Dockerfile's go build uses ${%s} but the Makefile sets no %s", name, name)
		}
	}
	base := strings.Fields(lastFrom)[1]
	if base != "scratch" && !strings.Contains(base, "distroless") {
		t.Errorf("the runtime stage is FROM %s, want scratch or distroless", base)
	}
	if user == "" || user == "root" || user == "0" || strings.HasPrefix(user, "0:") {
		t.Errorf("the image runs as user %q, want a non-root user", user)
	}
	out := ""
	for i, w := range shellWords(mk) {
		if w == "-o" && i+1 < len(shellWords(mk)) {
			out = shellWords(mk)[i+1]
		}
	}
	if copyBin == "" || !strings.Contains(copyBin, out) {
		t.Errorf("the runtime stage does not copy the binary the build writes (%s): %q", out, copyBin)
	}
	if !regexp.MustCompile(`^\["[^"]*/relay"\]$`).MatchString(entry) {
		t.Errorf("ENTRYPOINT %s, want the relay binary alone", entry)
	}
}

// unitValues reads a systemd unit's Key=Value lines (the last one wins, as
// for the keys this test reads).
func unitValues(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not Key=Value", path, line)
		}
		out[k] = v
	}
	return out
}

func TestSystemdUnitMatchesTheBinary(t *testing.T) {
	u := unitValues(t, "../../deploy/systemd/relay.service")
	exec := shellWords(u["ExecStart"])
	if len(exec) < 2 || filepath.Base(exec[0]) != "relay" {
		t.Fatalf("ExecStart=%s: want the relay binary and its command", u["ExecStart"])
	}
	if u["User"] == "" || u["User"] == "root" {
		t.Errorf("User=%s: want an unprivileged user", u["User"])
	}
	if u["EnvironmentFile"] == "" {
		t.Fatal("no EnvironmentFile: the DSN must not be on the command line")
	}
	for _, k := range []string{"NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "CapabilityBoundingSet", "RestrictAddressFamilies", "SystemCallFilter"} {
		if _, ok := u[k]; !ok {
			t.Errorf("no %s= in the unit's hardening", k)
		}
	}
	// The example environment file: every name is one relay run reads, and
	// the values are accepted.
	b, err := os.ReadFile("../../deploy/systemd/relay.env.example")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		env[k] = v
	}
	if env["RELAY_DATABASE_URL"] == "" {
		t.Error("relay.env.example sets no RELAY_DATABASE_URL")
	}
	cmd := parsed(t, "relay.service", exec[1:], env)
	names := envNames(cmd)
	for k := range env {
		if !names[k] {
			t.Errorf("relay.env.example: %s is not read by relay %s", k, cmd.Name())
		}
	}
	stop, _ := time.ParseDuration(cmd.Flag("stop-timeout").Value.String())
	if d, err := time.ParseDuration(u["TimeoutStopSec"]); err != nil || d <= stop {
		t.Errorf("TimeoutStopSec=%s must exceed --stop-timeout (%s), or systemd kills a graceful stop", u["TimeoutStopSec"], stop)
	}
}

// TestVersionPrintsTheCommitMakeBuildPassesIn: a binary built with
// -buildvcs=false (or without .git, as in the image) prints the commit given
// by -X main.commit (make build, the Dockerfile's COMMIT), not "unknown".
// go test stamps no VCS information, like such a build.
func TestVersionPrintsTheCommitMakeBuildPassesIn(t *testing.T) {
	old := commit
	t.Cleanup(func() { commit = old })
	commit = "0123456789abcdef0123456789abcdef01234567"
	if line := versionLine(); !strings.Contains(line, " commit "+commit+" ") {
		t.Fatalf("version line %q: want the commit %s", line, commit)
	}
	commit = ""
	if line := versionLine(); !strings.Contains(line, " commit unknown ") {
		t.Fatalf("version line %q: want commit unknown when nothing gave one", line)
	}
}

// The pods the project owns (the standalone relay, the migrate Job) mount
// no service account token, and a NetworkPolicy admits traffic to the
// standalone relay's monitor and metrics only from pods labelled for each.
// /metrics is served on a listener of its own (--metrics-addr), whose port
// no Service of the monitor carries: only a Service of its own.
func TestKubernetesManifestsLimitWhatReachesTheRelay(t *testing.T) {
	var policies int
	guarded := map[string]bool{}
	type servicePort struct {
		Name       string `yaml:"name"`
		TargetPort string `yaml:"targetPort"`
	}
	var services []struct {
		name  string
		ports []servicePort
	}
	for _, o := range manifests(t) {
		var obj struct {
			Spec struct {
				Template struct {
					Spec struct {
						Automount *bool `yaml:"automountServiceAccountToken"`
					} `yaml:"spec"`
				} `yaml:"template"`
				PodSelector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				} `yaml:"podSelector"`
				Ports   []servicePort `yaml:"ports"`
				Ingress []struct {
					From []struct {
						PodSelector struct {
							MatchLabels map[string]string `yaml:"matchLabels"`
						} `yaml:"podSelector"`
					} `yaml:"from"`
					Ports []struct {
						Port string `yaml:"port"`
					} `yaml:"ports"`
				} `yaml:"ingress"`
			} `yaml:"spec"`
		}
		if err := o.node.Decode(&obj); err != nil {
			t.Fatalf("%s %s: %v", o.file, o.Metadata.Name, err)
		}
		switch {
		case o.file != "sidecar.yaml" && (o.Kind == "Deployment" || o.Kind == "Job"):
			if a := obj.Spec.Template.Spec.Automount; a == nil || *a {
				t.Errorf("%s %s: set automountServiceAccountToken: false (the relay never calls the Kubernetes API)", o.file, o.Metadata.Name)
			}
		case o.Kind == "NetworkPolicy":
			policies++
			if obj.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "compensa-relay" {
				t.Errorf("%s %s: selects %v, not the relay's pods", o.file, o.Metadata.Name, obj.Spec.PodSelector.MatchLabels)
			}
			for _, in := range obj.Spec.Ingress {
				for _, p := range in.Ports {
					if (p.Port == "monitor" || p.Port == "metrics") && (len(in.From) == 0 || len(in.From[0].PodSelector.MatchLabels) == 0) {
						t.Errorf("%s %s: the %s port is open to every pod", o.file, o.Metadata.Name, p.Port)
					}
					if len(in.From) > 0 && len(in.From[0].PodSelector.MatchLabels) > 0 {
						guarded[p.Port] = true
					}
				}
			}
		case o.Kind == "Service" && o.file == "standalone.yaml":
			services = append(services, struct {
				name  string
				ports []servicePort
			}{o.Metadata.Name, obj.Spec.Ports})
		}
	}
	if policies == 0 {
		t.Error("no NetworkPolicy limits what reaches the standalone relay")
	}
	for _, port := range []string{"monitor", "metrics"} {
		if !guarded[port] {
			t.Errorf("no NetworkPolicy rule admits the %s port from labelled pods only", port)
		}
	}

	// The standalone relay serves /metrics on --metrics-addr, the port its
	// container names metrics, apart from the monitor's.
	var metricsPort int
	for _, rc := range relayContainers(t, manifests(t)) {
		if rc.kind != "Deployment" || !strings.HasPrefix(rc.where, "standalone.yaml") {
			continue
		}
		cmd := parsed(t, rc.where, rc.c.Args, rc.env())
		addr := cmd.Flag("metrics-addr").Value.String()
		_, mp, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%s: --metrics-addr %q: keep /metrics off the monitor with a listener of its own (%v)", rc.where, addr, err)
		}
		_, hp, _ := net.SplitHostPort(cmd.Flag("http-addr").Value.String())
		metricsPort = containerPort(rc.c, "metrics")
		if strconv.Itoa(metricsPort) != mp || mp == hp {
			t.Errorf("%s: the container port named metrics (%d) must be --metrics-addr's (%s), apart from --http-addr's (%s)", rc.where, metricsPort, mp, hp)
		}
	}
	if metricsPort == 0 {
		t.Fatal("no standalone relay Deployment found")
	}
	var metricsServices int
	for _, svc := range services {
		var monitor, metrics bool
		for _, p := range svc.ports {
			monitor = monitor || p.TargetPort == "monitor"
			metrics = metrics || p.TargetPort == "metrics" || p.TargetPort == strconv.Itoa(metricsPort)
		}
		if monitor && metrics {
			t.Errorf("Service %s carries the monitor and the metrics: give /metrics a Service of its own", svc.name)
		}
		if metrics {
			metricsServices++
		}
	}
	if metricsServices != 1 {
		t.Errorf("%d Services carry the metrics port, want one of its own", metricsServices)
	}
}

// TestImageNamesTheRelease: `make image` tags the image as a release
// publishes it (compensa/relay:X.Y.Z from the git tag vX.Y.Z, never
// :latest), and the Helm chart deploys by default the release the raw
// manifests name.
func TestImageNamesTheRelease(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	cmd := exec.Command("make", "--no-print-directory", "-n", "image", "VERSION=v1.2.3", "COMMIT=0123456789abcdef")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	words := shellWords(strings.TrimSpace(string(out)))
	i := slices.Index(words, "-t")
	if i < 0 || i+1 >= len(words) || words[i+1] != relayImage+":1.2.3" {
		t.Errorf("make image VERSION=v1.2.3 runs %q: want -t %s:1.2.3", out, relayImage)
	}
	if strings.Contains(string(out), ":latest") {
		t.Errorf("make image tags :latest: %s", out)
	}

	b, err := os.ReadFile("../../deploy/helm/compensa/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	if !releaseTag.MatchString(chart.AppVersion) {
		t.Errorf("deploy/helm/compensa/Chart.yaml: appVersion %q is not a release's version X.Y.Z", chart.AppVersion)
	}
	for _, rc := range relayContainers(t, manifests(t)) {
		if rc.c.Image != relayImage+":"+chart.AppVersion {
			t.Errorf("%s: image %s, but the chart deploys %s:%s: a release names one version in both", rc.where, rc.c.Image, relayImage, chart.AppVersion)
		}
	}
}

// TestDeploymentGuideKeepsUp: docs/deployment.md, linked from the README,
// names every top-level value of the Helm chart, and its relative links
// reach files of the repository.
func TestDeploymentGuideKeepsUp(t *testing.T) {
	doc, err := os.ReadFile("../../docs/deployment.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "(docs/deployment.md)") {
		t.Error("README.md does not link docs/deployment.md")
	}
	b, err := os.ReadFile("../../deploy/helm/compensa/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	for _, k := range slices.Sorted(maps.Keys(values)) {
		if !regexp.MustCompile("`" + regexp.QuoteMeta(k) + "[`.]").Match(doc) {
			t.Errorf("docs/deployment.md does not describe the chart's value %s", k)
		}
	}
	for _, m := range regexp.MustCompile(`\]\((\.\./[^)#]+)`).FindAllSubmatch(doc, -1) {
		if _, err := os.Stat(filepath.Join("../../docs", string(m[1]))); err != nil {
			t.Errorf("docs/deployment.md links %s: %v", m[1], err)
		}
	}
}
