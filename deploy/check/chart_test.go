package check

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The Helm chart of deploy/helm/compensa is linted and rendered with Helm's
// own code (the actions behind `helm lint` and `helm template`), in both
// modes, from the values files in its ci/ folder; the rendered objects are
// decoded strictly into Kubernetes' API types and checked for what the
// deployment needs: the migration as a hook that grants, probes on the
// listeners the relay opens, no readiness gate on the application, a
// release image, the metrics kept off the Service users reach.

const (
	chartDir    = "../helm/compensa"
	relayImage  = "compensa/relay"
	releaseName = "shop"
)

// kubeVersion is the cluster version the chart is rendered for: the oldest
// its Chart.yaml accepts would do, a current one catches removed APIs.
var kubeVersion = &common.KubeVersion{Version: "v1.33.0", Major: "1", Minor: "33"}

var releaseTag = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$`)

func values(t *testing.T, file string) map[string]any {
	t.Helper()
	v, err := common.ReadValuesFile(filepath.Join(chartDir, "ci", file))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rendered is a release as `helm template` renders it: its objects and its
// hooks, as Helm parsed them.
type rendered struct {
	objects []object
	hooks   []*release.Hook
}

type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	raw  []byte
	hook *release.Hook
}

func render(t *testing.T, vals map[string]any) (rendered, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = releaseName
	install.Namespace = "default"
	install.Replace = true
	install.KubeVersion = kubeVersion
	rel, err := install.Run(ch, vals)
	if err != nil {
		return rendered{}, err
	}
	r, ok := rel.(*release.Release)
	if !ok {
		t.Fatalf("a release of type %T", rel)
	}
	out := rendered{hooks: r.Hooks}
	add := func(manifest string, h *release.Hook) {
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(manifest, -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var o object
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
			}
			if o.Kind == "" {
				continue // a template that rendered only comments
			}
			o.raw, o.hook = []byte(doc), h
			out.objects = append(out.objects, o)
		}
	}
	add(r.Manifest, nil)
	for _, h := range r.Hooks {
		add(h.Manifest, h)
	}
	return out, nil
}

func mustRender(t *testing.T, file string) rendered {
	t.Helper()
	r, err := render(t, values(t, file))
	if err != nil {
		t.Fatalf("render with ci/%s: %v", file, err)
	}
	return r
}

// decode decodes the one object of kind named name (or the only one of its
// kind when name is "") into v, refusing fields v's type does not have.
func (r rendered) decode(t *testing.T, kind, name string, v any) *object {
	t.Helper()
	var found []object
	for _, o := range r.objects {
		if o.Kind == kind && (name == "" || o.Metadata.Name == name) {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s named %q, want 1", len(found), kind, name)
	}
	if err := yaml.UnmarshalStrict(found[0].raw, v); err != nil {
		t.Fatalf("%s %s: %v", kind, found[0].Metadata.Name, err)
	}
	return &found[0]
}

func (r rendered) all(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func TestChartLints(t *testing.T) {
	for _, file := range []string{"standalone-values.yaml", "sidecar-values.yaml"} {
		t.Run(file, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = "default"
			lint.KubeVersion = kubeVersion
			res := lint.Run([]string{chartDir}, values(t, file))
			if res.TotalChartsLinted != 1 {
				t.Errorf("%d charts linted, want 1", res.TotalChartsLinted)
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint: %v", err)
			}
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %v", m)
				}
			}
		})
	}
}

// TestChartFailsWithoutWhatTheRelayNeeds: a render without the DSN, the
// token or the owner's DSN, or with an unknown mode, stops with a message
// that names the value to set.
func TestChartFailsWithoutWhatTheRelayNeeds(t *testing.T) {
	cases := []struct {
		file, drop, want string
	}{
		{"standalone-values.yaml", "secret.databaseURL", "secret.databaseURL"},
		{"standalone-values.yaml", "secret.apiToken", "secret.apiToken"},
		{"standalone-values.yaml", "migrate.ownerDatabaseURL", "migrate.ownerDatabaseURL"},
		{"sidecar-values.yaml", "sidecar.application.name", "sidecar.application.name"},
	}
	for _, c := range cases {
		vals := values(t, c.file)
		path := strings.Split(c.drop, ".")
		m := vals
		for _, k := range path[:len(path)-1] {
			m = m[k].(map[string]any)
		}
		delete(m, path[len(path)-1])
		if _, err := render(t, vals); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ci/%s without %s: render error %v, want one naming %s", c.file, c.drop, err, c.want)
		}
	}
	vals := values(t, "standalone-values.yaml")
	vals["mode"] = "daemonset"
	if _, err := render(t, vals); err == nil || !strings.Contains(err.Error(), "standalone or sidecar") {
		t.Errorf("mode daemonset: render error %v, want one naming the modes", err)
	}
}

// relayPod checks what both modes share: the relay container's image, args,
// environment and liveness probe, the grace period, and returns the
// container.
func relayPod(t *testing.T, where string, pod corev1.PodSpec) corev1.Container {
	t.Helper()
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "relay" })
	if i < 0 {
		t.Fatalf("%s: no relay container", where)
	}
	c := pod.Containers[i]
	checkImage(t, where, c.Image)
	if len(c.Command) > 0 || len(c.Args) == 0 || c.Args[0] != "run" {
		t.Errorf("%s: command %q args %q: want args starting with run, the image's entrypoint being relay", where, c.Command, c.Args)
	}
	flags := argFlags(c.Args)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for flag, port := range map[string]string{"http-addr": "monitor", "probe-addr": "probe", "metrics-addr": "metrics"} {
		host, p, err := net.SplitHostPort(flags[flag])
		if err != nil || host != "0.0.0.0" {
			t.Errorf("%s: --%s=%q: want 0.0.0.0:PORT, the pod's address the kubelet and Prometheus reach", where, flag, flags[flag])
			continue
		}
		if fmt.Sprint(ports[port]) != p {
			t.Errorf("%s: --%s listens on %s, but the container port %s is %d", where, flag, p, port, ports[port])
		}
	}
	lp := c.LivenessProbe
	if lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/healthz" || lp.HTTPGet.Port != intstr.FromString("probe") {
		t.Errorf("%s: livenessProbe %s: want GET /healthz on the probe port", where, probeString(lp))
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, k := range []string{"RELAY_DATABASE_URL", "RELAY_API_TOKEN"} {
		if e, ok := env[k]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s: %s must come from a Secret", where, k)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: resources must request cpu and memory and limit memory", where)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: securityContext %+v: want a read-only root and no privilege escalation", where, sc)
	}
	stop, err := time.ParseDuration(flags["stop-timeout"])
	if err != nil {
		t.Errorf("%s: --stop-timeout=%q: %v", where, flags["stop-timeout"], err)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= stop {
		t.Errorf("%s: terminationGracePeriodSeconds must exceed --stop-timeout (%s), or a graceful stop is cut short", where, stop)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("%s: automountServiceAccountToken must be false (the relay never calls the Kubernetes API)", where)
	}
	return c
}

func probeString(p *corev1.Probe) string {
	if p == nil || p.HTTPGet == nil {
		return "without httpGet"
	}
	return fmt.Sprintf("GET %s on port %s", p.HTTPGet.Path, p.HTTPGet.Port.String())
}

func argFlags(args []string) map[string]string {
	out := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
			out[k] = v
		}
	}
	return out
}

func checkImage(t *testing.T, where, image string) {
	t.Helper()
	tag, ok := strings.CutPrefix(image, relayImage+":")
	if !ok || !releaseTag.MatchString(tag) {
		t.Errorf("%s: image %q: want %s:X.Y.Z (a release's tag; nothing publishes :latest)", where, image, relayImage)
	}
}

// checkMigrateHook: relay migrate --grant-to runs as a pre-install and
// pre-upgrade hook, made anew on each release, from a Secret that exists
// before it runs.
func checkMigrateHook(t *testing.T, r rendered, ownerSecretIsHook bool) {
	t.Helper()
	var job batchv1.Job
	o := r.decode(t, "Job", "", &job)
	if o.hook == nil {
		t.Fatalf("Job %s is not a hook: installed with the release, it races the relay and cannot be re-applied (its pod template is immutable)", job.Name)
	}
	events := o.hook.Events
	if !slices.Contains(events, release.HookPreInstall) || !slices.Contains(events, release.HookPreUpgrade) {
		t.Errorf("Job %s: hook events %v, want pre-install and pre-upgrade", job.Name, events)
	}
	if !slices.Contains(o.hook.DeletePolicies, release.HookBeforeHookCreation) {
		t.Errorf("Job %s: delete policies %v: without before-hook-creation the next release's Job collides with this one", job.Name, o.hook.DeletePolicies)
	}
	if job.Spec.TTLSecondsAfterFinished == nil {
		t.Errorf("Job %s: no ttlSecondsAfterFinished", job.Name)
	}
	pod := job.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Job %s: %d containers", job.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	checkImage(t, "Job "+job.Name, c.Image)
	if len(c.Args) == 0 || c.Args[0] != "migrate" || argFlags(c.Args)["grant-to"] == "" {
		t.Errorf("Job %s: args %q: want migrate --grant-to=ROLE, or relay run as its own role lacks every privilege on a fresh database", job.Name, c.Args)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("Job %s: automountServiceAccountToken must be false", job.Name)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "RELAY_DATABASE_URL" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.SecretKeyRef == nil || c.Env[0].ValueFrom.SecretKeyRef.Key != "owner-database-url" {
		t.Fatalf("Job %s: env %+v: want RELAY_DATABASE_URL from a Secret's owner-database-url", job.Name, c.Env)
	}
	secret := c.Env[0].ValueFrom.SecretKeyRef.Name
	for _, s := range r.all("Secret") {
		if s.Metadata.Name != secret {
			continue
		}
		// A pre-install hook runs before the release's ordinary objects
		// exist: the Secret it reads must be a hook of lower weight.
		if s.hook == nil || s.hook.Weight >= o.hook.Weight || !slices.Contains(s.hook.Events, release.HookPreInstall) || !slices.Contains(s.hook.Events, release.HookPreUpgrade) {
			t.Errorf("Secret %s, read by the migrate Job, must be a pre-install/pre-upgrade hook weighing less than the Job", secret)
		}
		if !ownerSecretIsHook {
			t.Errorf("Secret %s rendered although migrate.existingSecret names one", secret)
		}
		return
	}
	if ownerSecretIsHook {
		t.Errorf("the migrate Job reads Secret %s, which the chart does not render", secret)
	}
}

// checkMonitoring: the ServiceMonitor scrapes a Service of its own, under
// the job the alert rules select, and the PrometheusRule holds the rules
// of deploy/prometheus/alerts.yml.
func checkMonitoring(t *testing.T, r rendered, public string) {
	t.Helper()
	var sm struct {
		Spec struct {
			JobLabel string `json:"jobLabel"`
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port string `json:"port"`
				Path string `json:"path"`
			} `json:"endpoints"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(r.all("ServiceMonitor")[0].raw, &sm); err != nil {
		t.Fatal(err)
	}
	var scraped []object
	for _, s := range r.all("Service") {
		if matches(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
			scraped = append(scraped, s)
		}
	}
	if len(scraped) != 1 {
		t.Fatalf("the ServiceMonitor selects %d Services, want its own one", len(scraped))
	}
	if scraped[0].Metadata.Name == public {
		t.Errorf("the ServiceMonitor scrapes through %s, the Service users reach", public)
	}
	if job := scraped[0].Metadata.Labels[sm.Spec.JobLabel]; job != "compensa" {
		t.Errorf("scrapes get job=%q (label %q of Service %s), but the alert rules select job=\"compensa\"", job, sm.Spec.JobLabel, scraped[0].Metadata.Name)
	}
	var svc corev1.Service
	r.decode(t, "Service", scraped[0].Metadata.Name, &svc)
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != sm.Spec.Endpoints[0].Port || svc.Spec.Ports[0].TargetPort != intstr.FromString("metrics") {
		t.Errorf("the ServiceMonitor's endpoints %+v do not reach /metrics on the relay's metrics port through %s", sm.Spec.Endpoints, svc.Name)
	}
	if svc.Spec.Type != corev1.ServiceTypeClusterIP && svc.Spec.Type != "" {
		t.Errorf("Service %s is of type %s; the metrics stay in the cluster (ClusterIP)", svc.Name, svc.Spec.Type)
	}

	var rule struct {
		Spec any `json:"spec"`
	}
	if err := yaml.Unmarshal(r.all("PrometheusRule")[0].raw, &rule); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want any
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if !equalJSON(t, rule.Spec, want) {
		t.Error("the PrometheusRule's spec differs from deploy/prometheus/alerts.yml")
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err1 := yaml.Marshal(a)
	jb, err2 := yaml.Marshal(b)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	return bytes.Equal(ja, jb)
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

// checkNetworkPolicy: the relay's pods admit the monitor port only from
// pods labelled for it.
func checkNetworkPolicy(t *testing.T, r rendered, podLabels map[string]string) networkingv1.NetworkPolicy {
	t.Helper()
	var np networkingv1.NetworkPolicy
	r.decode(t, "NetworkPolicy", "", &np)
	if !matches(np.Spec.PodSelector.MatchLabels, podLabels) {
		t.Errorf("NetworkPolicy %s selects %v, not the relay's pods %v", np.Name, np.Spec.PodSelector.MatchLabels, podLabels)
	}
	for _, port := range []string{"monitor", "metrics"} {
		admitted := false
		for _, in := range np.Spec.Ingress {
			for _, p := range in.Ports {
				if p.Port != nil && *p.Port == intstr.FromString(port) {
					admitted = true
					if len(in.From) == 0 || in.From[0].PodSelector == nil || len(in.From[0].PodSelector.MatchLabels) == 0 {
						t.Errorf("NetworkPolicy %s: the %s port is open to every pod", np.Name, port)
					}
				}
			}
		}
		if !admitted {
			t.Errorf("NetworkPolicy %s admits nothing to the %s port", np.Name, port)
		}
	}
	return np
}

func TestChartStandalone(t *testing.T) {
	r := mustRender(t, "standalone-values.yaml")
	var d appsv1.Deployment
	r.decode(t, "Deployment", "", &d)
	where := "Deployment " + d.Name
	c := relayPod(t, where, d.Spec.Template.Spec)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("%s: %v replicas, want 2 (one streams, the other takes over)", where, d.Spec.Replicas)
	}
	rp := c.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz" || rp.HTTPGet.Port != intstr.FromString("probe") {
		t.Errorf("%s: readinessProbe %s: want GET /readyz on the probe port (a replica whose database is unreachable leaves the Service)", where, probeString(rp))
	}
	if a := d.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil {
		t.Errorf("%s: no pod anti-affinity: both replicas may land on one node", where)
	}

	// The declared sagas, the sinks file and the tokens file are mounted
	// where the environment points.
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for k, vol := range map[string]string{"RELAY_SAGAS": "sagas", "RELAY_SINKS": "sinks", "RELAY_API_TOKENS": "api-tokens"} {
		if env[k] == "" || mounts[vol] == "" || !strings.HasPrefix(env[k], mounts[vol]) {
			t.Errorf("%s: %s=%q is not in the volume %s mounted at %q", where, k, env[k], vol, mounts[vol])
		}
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != "compensa-relay-extra" {
		t.Errorf("%s: envFrom %+v: want the Secret of envFromSecrets", where, c.EnvFrom)
	}
	for _, a := range []string{"checksum/sagas", "checksum/sinks", "checksum/api-tokens"} {
		if d.Spec.Template.Annotations[a] == "" {
			t.Errorf("%s: no %s annotation: a changed file would not roll the pods", where, a)
		}
	}

	// The page's Service: the monitor port, one replica per browser.
	var svc corev1.Service
	r.decode(t, "Service", d.Name, &svc)
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		t.Errorf("Service %s: sessionAffinity %q: the page's login sessions live in one replica each; want ClientIP", svc.Name, svc.Spec.SessionAffinity)
	}
	if !matches(svc.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("Service %s selects %v, not the relay's pods", svc.Name, svc.Spec.Selector)
	}
	for _, p := range svc.Spec.Ports {
		if p.TargetPort != intstr.FromString("monitor") {
			t.Errorf("Service %s: port %s targets %v; the page's Service carries the monitor port only", svc.Name, p.Name, p.TargetPort)
		}
	}
	checkMigrateHook(t, r, true)
	checkMonitoring(t, r, svc.Name)
	checkNetworkPolicy(t, r, d.Spec.Template.Labels)
	checkNoLatest(t, r)

	// The relay's Secrets hold what the values gave.
	var s corev1.Secret
	r.decode(t, "Secret", d.Name, &s)
	if s.StringData["database-url"] == "" || s.StringData["api-token"] == "" {
		t.Errorf("Secret %s: %v: want database-url and api-token", s.Name, s.StringData)
	}
}

func TestChartSidecar(t *testing.T) {
	r := mustRender(t, "sidecar-values.yaml")
	var d appsv1.Deployment
	r.decode(t, "Deployment", "", &d)
	where := "Deployment " + d.Name
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 2 || pod.Containers[0].Name != "app" {
		t.Fatalf("%s: containers %d: want the application's and the relay", where, len(pod.Containers))
	}
	c := relayPod(t, where, pod)
	if c.ReadinessProbe != nil {
		t.Errorf("%s: a readinessProbe on the relay sidecar gates the application's readiness on the relay", where)
	}
	if c.StartupProbe != nil {
		t.Errorf("%s: a startupProbe on the relay sidecar holds the application's readiness until the relay starts", where)
	}
	// The application's Service: its own ports only.
	var svc corev1.Service
	r.decode(t, "Service", d.Name, &svc)
	for _, p := range svc.Spec.Ports {
		for _, rp := range c.Ports {
			if p.TargetPort == intstr.FromString(rp.Name) || p.TargetPort == intstr.FromInt32(rp.ContainerPort) {
				t.Errorf("Service %s: port %s reaches the relay's %s port; the application's Service carries the application's ports only", svc.Name, p.Name, rp.Name)
			}
		}
	}
	for _, o := range r.all("Secret") {
		if o.hook == nil {
			t.Errorf("Secret %s rendered although secret.existingSecret names one", o.Metadata.Name)
		}
	}
	checkMigrateHook(t, r, false)
	checkMonitoring(t, r, svc.Name)
	np := checkNetworkPolicy(t, r, d.Spec.Template.Labels)
	// The policy selects the application's pods: it must still admit the
	// application's own port.
	app := false
	for _, in := range np.Spec.Ingress {
		for _, p := range in.Ports {
			if p.Port != nil && *p.Port == intstr.FromInt32(8000) && len(in.From) == 0 {
				app = true
			}
		}
	}
	if !app {
		t.Errorf("NetworkPolicy %s shuts out the application's own port 8000", np.Name)
	}
	checkNoLatest(t, r)
}

// checkNoLatest: no container of the relay's image names :latest or no tag.
func checkNoLatest(t *testing.T, r rendered) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\s*image:\s*"?(\S+?)"?\s*$`)
	n := 0
	for _, o := range r.objects {
		for _, m := range re.FindAllStringSubmatch(string(o.raw), -1) {
			if strings.HasPrefix(m[1], relayImage) {
				n++
				checkImage(t, o.Kind+" "+o.Metadata.Name, m[1])
			}
		}
	}
	if n < 2 {
		t.Errorf("%d relay images rendered, want the relay's and the migration's", n)
	}
}

// TestChartAlertsAreTheRepositorysAlerts: the chart carries a copy of
// deploy/prometheus/alerts.yml (a chart reads only its own files, and
// tools refuse links out of it); the copy must stay equal.
func TestChartAlertsAreTheRepositorysAlerts(t *testing.T) {
	a, err1 := os.ReadFile("../prometheus/alerts.yml")
	b, err2 := os.ReadFile(filepath.Join(chartDir, "files/alerts.yml"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("deploy/helm/compensa/files/alerts.yml differs from deploy/prometheus/alerts.yml: cp deploy/prometheus/alerts.yml deploy/helm/compensa/files/alerts.yml")
	}
}

// TestChartSpeaksTheBinarysFlags builds the relay and checks every flag the
// chart passes and every RELAY_ variable it sets against the binary's own
// help.
func TestChartSpeaksTheBinarysFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the relay")
	}
	bin := filepath.Join(t.TempDir(), "relay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/relay")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/relay: %v\n%s", err, out)
	}
	help := map[string]string{}
	for _, cmd := range []string{"run", "migrate"} {
		out, err := exec.Command(bin, cmd, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("relay %s --help: %v\n%s", cmd, err, out)
		}
		help[cmd] = string(out)
	}
	for _, file := range []string{"standalone-values.yaml", "sidecar-values.yaml"} {
		r := mustRender(t, file)
		for _, o := range r.objects {
			if o.Kind != "Deployment" && o.Kind != "Job" {
				continue
			}
			var w struct {
				Spec struct {
					Template corev1.PodTemplateSpec `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(o.raw, &w); err != nil {
				t.Fatal(err)
			}
			for _, c := range w.Spec.Template.Spec.Containers {
				if !strings.HasPrefix(c.Image, relayImage+":") {
					continue
				}
				h := help[c.Args[0]]
				hasFlag := func(name string) bool {
					return regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(name) + `[ =]`).MatchString(h)
				}
				for _, a := range c.Args[1:] {
					name, _, _ := strings.Cut(a, "=")
					if !hasFlag(name) {
						t.Errorf("ci/%s: %s %s: relay %s has no flag %s", file, o.Kind, o.Metadata.Name, c.Args[0], name)
					}
				}
				// The relay reads RELAY_<FLAG> for each of its flags.
				for _, e := range c.Env {
					if flag, ok := strings.CutPrefix(e.Name, "RELAY_"); ok && !hasFlag("--"+strings.ToLower(strings.ReplaceAll(flag, "_", "-"))) {
						t.Errorf("ci/%s: %s %s: relay %s reads no %s (it has no flag for it)", file, o.Kind, o.Metadata.Name, c.Args[0], e.Name)
					}
				}
			}
		}
	}
}
