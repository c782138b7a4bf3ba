package declare

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"go.yaml.in/yaml/v3"

	"github.com/compensa/compensa/saga"
)

// Options tune a load.
type Options struct {
	// RequireSecrets checks that every secrets.NAME a file reads has its
	// RELAY_SECRET_NAME variable set (relay run does; validate does not,
	// since it runs where the secrets are not).
	RequireSecrets bool
	// LookupEnv reads the environment; nil is os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// SkipSchemaFiles leaves out trigger schemas given as file paths (a
	// stored body, loaded where its files are not: such a version is kept
	// for its running instances and starts nothing new).
	SkipSchemaFiles bool
}

// LoadDir loads every *.yaml and *.yml file of dir (not recursive). It
// returns the sagas ordered by name and version, or every problem of every
// file as Problems.
func LoadDir(dir string, opt Options) ([]*Saga, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, Problems{{File: dir, Msg: fmt.Sprintf("cannot read the saga directory: %v; pass a directory that holds *.yaml files", err)}}
	}
	var files []string
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if !e.IsDir() && (ext == ".yaml" || ext == ".yml") && !isTestFile(e.Name()) {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, Problems{{File: dir, Msg: "no *.yaml or *.yml file in the saga directory; add one saga definition per file"}}
	}
	var all []*Saga
	var probs Problems
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			probs = append(probs, Problem{File: f, Msg: fmt.Sprintf("cannot read: %v; check its permissions", err)})
			continue
		}
		s, ps := LoadFile(f, b, opt)
		probs = append(probs, ps...)
		if s != nil {
			all = append(all, s)
		}
	}
	probs = append(probs, checkSet(all)...)
	if len(probs) > 0 {
		return nil, probs.sorted()
	}
	sortSagas(all)
	return all, nil
}

func sortSagas(all []*Saga) {
	sort.Slice(all, func(i, j int) bool {
		if all[i].Name != all[j].Name {
			return all[i].Name < all[j].Name
		}
		return all[i].Version < all[j].Version
	})
}

// checkSet finds a (saga, version) declared in two files.
func checkSet(all []*Saga) Problems {
	var probs Problems
	seen := map[saga.Key]*Saga{}
	for _, s := range all {
		k := saga.Key{Name: s.Name, Version: s.Version}
		if first, dup := seen[k]; dup {
			probs = append(probs, Problem{File: s.File, Line: s.namePos.Line, Col: s.namePos.Col,
				Msg: fmt.Sprintf("%s version %d is also declared in %s; give one of them another version", s.Name, s.Version, first.File)})
			continue
		}
		seen[k] = s
	}
	return probs
}

// LoadFile loads one definition from its bytes; name is used in messages.
// It returns the saga, or nil and every problem found.
func LoadFile(name string, body []byte, opt Options) (*Saga, Problems) {
	r := &report{file: name}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&doc); err != nil {
		r.add(yamlErrorPos(err), "YAML syntax: %s; fix the syntax", yamlErrorText(err))
		return nil, r.list.sorted()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		r.add(nodeAt(&extra), "a second YAML document in one file; put one saga version per file")
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		at := pos{1, 1}
		if len(doc.Content) > 0 {
			at = nodeAt(doc.Content[0])
		}
		r.add(at, "the file is not a saga definition (a mapping with saga, version, triggers, steps); start from the example in README.md")
		return nil, r.list.sorted()
	}
	root := doc.Content[0]
	dv := newDocValue()
	v := dv.convert(root, "", r, 0)
	checkSchema(v, dv, r)
	s, extraHash := build(name, root, v, r, opt)
	if len(r.list) > 0 {
		return nil, r.list.sorted()
	}
	canon, err := json.Marshal(plain(v))
	if err != nil {
		r.add(pos{}, "cannot encode the definition: %v; report this as a bug", err)
		return nil, r.list
	}
	sum := sha256.Sum256(append(canon, extraHash...))
	s.Hash = hex.EncodeToString(sum[:])
	s.Body = append([]byte(nil), body...)
	return s, nil
}

func yamlErrorText(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: ")
	if i := strings.Index(msg, "line "); i == 0 {
		if j := strings.Index(msg, ": "); j > 0 {
			msg = msg[j+2:]
		}
	}
	return msg
}

// yamlErrorPos reads "line N" (and ", column M" where given) from a yaml.v3
// error.
func yamlErrorPos(err error) pos {
	msg := err.Error()
	p := pos{1, 1}
	if i := strings.Index(msg, "line "); i >= 0 {
		fmt.Sscanf(msg[i:], "line %d", &p.Line)
		if j := strings.Index(msg[i:], "column "); j >= 0 {
			fmt.Sscanf(msg[i+j:], "column %d", &p.Col)
		}
	}
	return p
}

// mapping helpers over a YAML mapping node.
type mapping struct{ n *yaml.Node }

func (m mapping) get(key string) *yaml.Node {
	if m.n == nil || m.n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.n.Content); i += 2 {
		if m.n.Content[i].Value == key {
			return m.n.Content[i+1]
		}
	}
	return nil
}

func (m mapping) keyAt(key string) pos {
	for i := 0; i+1 < len(m.n.Content); i += 2 {
		if m.n.Content[i].Value == key {
			return nodeAt(m.n.Content[i])
		}
	}
	return nodeAt(m.n)
}

func (m mapping) str(key string) string {
	if n := m.get(key); n != nil && n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

func (m mapping) sub(key string) mapping {
	if n := m.get(key); n != nil && n.Kind == yaml.MappingNode {
		return mapping{n}
	}
	return mapping{}
}

func (m mapping) ok() bool { return m.n != nil }

func (m mapping) list(key string) []*yaml.Node {
	if n := m.get(key); n != nil && n.Kind == yaml.SequenceNode {
		return n.Content
	}
	return nil
}

// duration reads a duration key; the schema has checked its form, this
// reports what it cannot (a value that overflows).
// durationShape is the schema's duration pattern.
var durationShape = regexp.MustCompile(`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`)

func (m mapping) duration(key string, r *report) time.Duration {
	n := m.get(key)
	if n == nil || n.Kind != yaml.ScalarNode {
		return 0
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		// The schema reports a malformed one; an overflow passes its pattern.
		if strings.Contains(err.Error(), "invalid duration") && !strings.Contains(err.Error(), "unknown unit") && durationShape.MatchString(n.Value) {
			r.add(nodeAt(n), "%q is too long a duration; use a smaller one", n.Value)
		}
		return 0
	}
	if d < 0 {
		r.add(nodeAt(n), "%q is negative; use a positive duration", n.Value)
	}
	return d
}

func (m mapping) retry(key string, def saga.RetryPolicy, r *report) saga.RetryPolicy {
	rm := m.sub(key)
	if !rm.ok() {
		return def
	}
	p := def
	if n := rm.get("max_attempts"); n != nil {
		var i int
		if n.Decode(&i) == nil && i > 0 {
			p.MaxAttempts = i
		}
	}
	if d := rm.duration("initial", r); d > 0 {
		p.Base = d
	}
	if n := rm.get("factor"); n != nil {
		var f float64
		if n.Decode(&f) == nil && f >= 1 {
			p.Factor = f
		}
	}
	if d := rm.duration("max", r); d > 0 {
		p.Max = d
	}
	eff := p.WithDefaults(saga.DefaultStepRetry)
	if eff.Max < eff.Base {
		r.add(rm.keyAt("max"), "%s.max (%s) is below %s.initial (%s); make max at least initial", key, eff.Max, key, eff.Base)
	}
	return p
}

// build turns a schema-checked document into a Saga, checking what the
// schema cannot: step names, scopes of expressions, CEL.
func build(file string, root *yaml.Node, doc any, r *report, opt Options) (*Saga, []byte) {
	m := mapping{root}
	s := &Saga{File: file, Name: m.str("saga"), namePos: m.keyAt("saga")}
	if n := m.get("version"); n != nil {
		_ = n.Decode(&s.Version)
	}
	var extraHash []byte
	s.Triggers, s.contracts, extraHash = loadTriggers(file, m, doc, r, opt)
	s.Deadline = m.duration("deadline", r)
	for _, n := range m.sub("egress").list("allow") {
		if n.Kind != yaml.ScalarNode {
			continue // the schema says so
		}
		if _, _, err := parseAllowEntry(n.Value); err != nil {
			r.add(nodeAt(n), "egress.allow: %v", err)
			continue
		}
		s.Egress = append(s.Egress, n.Value)
	}
	s.Concurrency = buildConcurrency(file, m, s.contracts, r)
	defs := m.sub("defaults")
	defTimeout := defs.duration("timeout", r)
	defRetry := defs.retry("retry", saga.RetryPolicy{}, r)
	defComp := defs.retry("compensation_retry", saga.RetryPolicy{}, r)

	stepNodes := m.list("steps")
	order := map[string]int{}
	for i, sn := range stepNodes {
		sm := mapping{sn}
		name := sm.str("name")
		if name == "" {
			continue
		}
		if first, dup := order[name]; dup {
			r.add(nodeAt(sm.get("name")), "step name %q is used twice (first by step %d); give each step its own name", name, first+1)
			continue
		}
		order[name] = i
	}
	// outputs[name] is the set of keys of the step's output (nil: not a
	// mapping, keys unknown); a step without output is absent.
	outputs := map[string]map[string]bool{}
	for i, sn := range stepNodes {
		sm := mapping{sn}
		st := &Step{Name: sm.str("name"), at: nodeAt(sn), Timeout: defTimeout,
			Retry: defRetry, CompensationRetry: defComp}
		place := fmt.Sprintf("steps[%d]", i)
		if st.Name != "" {
			place = "step " + st.Name
		}
		before := map[string]map[string]bool{}
		for k, v := range outputs {
			before[k] = v
		}
		base := scope{steps: before, stepOrder: order, self: i, contracts: s.contracts}
		kinds := 0
		for _, k := range []string{"sql", "http", "command"} {
			if sm.get(k) != nil {
				kinds++
				if kinds == 2 {
					r.add(sm.keyAt(k), "step %s has more than one of sql, http, command; split it into one step per action", st.Name)
				}
			}
		}
		st.Action = buildAction(file, sm, place, base, false, r)
		st.When = buildWhen(file, sm, place, base, r)
		st.Rate = buildRate(sm, place, r)
		if wn := sm.get("wait"); wn != nil {
			st.Wait = buildWait(file, sm, place, base, r)
			for _, k := range []string{"sql", "http", "command", "emit", "output", "compensate"} {
				if sm.get(k) != nil {
					r.add(sm.keyAt(k), "step %s waits and has %s: a wait step only waits; put %s in a step of its own before or after it", st.Name, k, k)
				}
			}
		} else if kinds == 0 && len(st.Action.Emit) == 0 && sm.get("emit") == nil {
			r.add(nodeAt(sn), "step %s does nothing; give it one of sql, http, command, or emit", st.Name)
		}
		if d := sm.duration("timeout", r); d > 0 {
			st.Timeout = d
		}
		st.Retry = sm.retry("retry", defRetry, r)
		st.CompensationRetry = sm.retry("compensation_retry", defComp, r)
		st.Errors = sm.errorRules(r)
		if on := sm.get("output"); on != nil {
			sc := base
			sc.place = place + ".output"
			sc.result, sc.response, sc.reply = actionScope(st.Action.Kind())
			st.Output = compileTemplate(on, file, &sc, r)
		}
		if cn := sm.get("compensate"); cn != nil {
			cm := mapping{cn}
			if cm.get("command") != nil {
				r.add(cm.keyAt("command"), "a compensation cannot wait for a reply; send the command with compensate.emit")
			}
			cs := base
			// A compensation may read its own step's output.
			if st.Name != "" && sm.get("output") != nil {
				cs.steps = map[string]map[string]bool{}
				for k, v := range before {
					cs.steps[k] = v
				}
				cs.steps[st.Name] = outputKeys(sm.get("output"))
			}
			ckinds := 0
			for _, k := range []string{"sql", "http"} {
				if cm.get(k) != nil {
					ckinds++
					if ckinds == 2 {
						r.add(cm.keyAt(k), "the compensation of step %s has both sql and http; keep one (a compensation has one action)", st.Name)
					}
				}
			}
			reads := false
			cs.selfName, cs.readsSelf, cs.step = st.Name, &reads, true
			a := buildAction(file, cm, place+".compensate", cs, true, r)
			a.readsOwnOutput = reads
			if ckinds == 0 && cm.get("emit") == nil && cm.get("command") == nil {
				r.add(nodeAt(cn), "the compensation of step %s does nothing; give it sql, http or emit, or remove compensate", st.Name)
			}
			st.Compensate = &a
		}
		s.Steps = append(s.Steps, st)
		if st.Name != "" && sm.get("output") != nil {
			outputs[st.Name] = outputKeys(sm.get("output"))
		}
	}
	if opt.RequireSecrets {
		lookup := opt.LookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		for _, st := range s.Steps {
			for _, a := range []*Action{&st.Action, st.Compensate} {
				if a == nil || a.HTTP == nil {
					continue
				}
				for _, name := range a.HTTP.secretNames() {
					if _, ok := lookup(SecretEnvPrefix + name); !ok {
						r.add(st.at, "step %s reads secrets.%s but %s%s is not set; set that environment variable for the relay", st.Name, name, SecretEnvPrefix, name)
					}
				}
			}
		}
	}
	return s, extraHash
}

// SecretEnvPrefix prefixes the environment variable of a secret:
// secrets.PAYMENTS_TOKEN is RELAY_SECRET_PAYMENTS_TOKEN.
const SecretEnvPrefix = "RELAY_SECRET_"

func outputKeys(n *yaml.Node) map[string]bool {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	keys := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		keys[n.Content[i].Value] = true
	}
	return keys
}

// actionScope says which of result, response, reply an action's output and
// emits may read.
func actionScope(kind string) (result, response, reply bool) {
	return kind == "sql", kind == "http", kind == "command"
}

func buildAction(file string, m mapping, place string, base scope, comp bool, r *report) Action {
	var a Action
	if q := m.sub("sql"); q.ok() {
		sa := &SQLAction{Query: q.str("query"), Expect: q.str("expect")}
		if sa.Expect == "" {
			sa.Expect = "any"
		}
		if qn := q.get("query"); qn != nil && strings.Contains(qn.Value, "${") {
			r.add(nodeAt(qn), "%s.sql.query holds ${ … }: SQL text is never built from expressions; pass the value as a parameter ($1, $2, …) in params", place)
		}
		for i, pn := range q.list("params") {
			sc := base
			sc.place = fmt.Sprintf("%s.sql.params[%d]", place, i)
			sa.Params = append(sa.Params, compileTemplate(pn, file, &sc, r))
		}
		a.SQL = sa
	}
	if h := m.sub("http"); h.ok() {
		ha := &HTTPAction{Method: h.str("method"), FollowRedirects: h.str("follow_redirects")}
		if ha.FollowRedirects == "never" {
			ha.FollowRedirects = ""
		}
		sc := base
		sc.secrets = true
		sc.place = place + ".http.url"
		sc.url = true
		ha.URL = compileTemplate(h.get("url"), file, &sc, r)
		sc.url = false
		ha.LiteralHost = literalURLHost(ha.URL)
		if un := h.get("url"); un != nil && ha.URL != nil && ha.URL.single == nil && !ha.URL.isText {
			if s, ok := ha.URL.literal.(string); ok {
				if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					r.add(nodeAt(un), "%s.http.url %q is not an http:// or https:// URL with a host; an http step calls only those", place, s)
				}
			}
		}
		sc.place = place + ".http.headers"
		ha.Headers = headers(h.get("headers"), file, &sc, r)
		if bn := h.get("body"); bn != nil {
			bs := base
			bs.place = place + ".http.body"
			ha.Body = compileTemplate(bn, file, &bs, r)
		}
		a.HTTP = ha
	}
	if c := m.sub("command"); c.ok() && !comp {
		ca := &CommandAction{Message: buildMessage(file, c, place+".command", base, r)}
		ca.ReplyTimeout = c.duration("reply_timeout", r)
		if ca.OnTimeout = c.str("on_timeout"); ca.OnTimeout == "retry" {
			ca.OnTimeout = ""
		}
		a.Command = ca
	}
	emitScope := base
	emitScope.result, emitScope.response, emitScope.reply = actionScope(a.Kind())
	for i, en := range m.list("emit") {
		a.Emit = append(a.Emit, ptr(buildMessage(file, mapping{en}, fmt.Sprintf("%s.emit[%d]", place, i), emitScope, r)))
	}
	return a
}

func ptr[T any](v T) *T { return &v }

func buildMessage(file string, m mapping, place string, base scope, r *report) Message {
	msg := Message{EventType: m.str("event_type")}
	sc := base
	if n := m.get("aggregate_type"); n != nil {
		sc.place = place + ".aggregate_type"
		msg.AggregateType = compileTemplate(n, file, &sc, r)
	}
	if n := m.get("aggregate_id"); n != nil {
		sc.place = place + ".aggregate_id"
		msg.AggregateID = compileTemplate(n, file, &sc, r)
	}
	if n := m.get("payload"); n != nil {
		sc.place = place + ".payload"
		msg.Payload = compileTemplate(n, file, &sc, r)
	}
	sc.place = place + ".headers"
	msg.Headers = headers(m.get("headers"), file, &sc, r)
	return msg
}

func headers(n *yaml.Node, file string, sc *scope, r *report) []header {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	var out []header
	for i := 0; i+1 < len(n.Content); i += 2 {
		sub := *sc
		sub.place = sc.place + "." + n.Content[i].Value
		out = append(out, header{name: n.Content[i].Value, value: compileTemplate(n.Content[i+1], file, &sub, r)})
	}
	return out
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// Warnings are what a load accepts but an operator should know: an http
// step whose URL's host comes from an expression in a file without
// egress.allow (every call is refused unless the relay lists the hosts with
// --http-egress-allow).
//
// And every expression of an http step's URL whose text goes in unescaped
// without saying so: a URL that is one expression, or one that starts with
// an expression (it gives the scheme and host); raw(…) says so.
func (s *Saga) Warnings() Problems {
	var out Problems
	for _, st := range s.Steps {
		for _, a := range []*Action{&st.Action, st.Compensate} {
			if a == nil || a.HTTP == nil {
				continue
			}
			for _, e := range unescapedURLParts(a.HTTP.URL) {
				out = append(out, Problem{File: s.File, Line: e.line, Col: e.col, Msg: fmt.Sprintf(
					"warning: %s builds the start of step %s's http.url, so its text goes in as it is, event data included: "+
						"write the scheme and host as text and each value in ${ … } after them (each is escaped for where it stands), "+
						"or write ${ raw(…) } to say the expression builds the URL", e, st.Name)})
			}
		}
	}
	if len(s.Egress) > 0 {
		return out
	}
	for _, st := range s.Steps {
		for _, a := range []*Action{&st.Action, st.Compensate} {
			if a == nil || a.HTTP == nil || a.HTTP.URL == nil || a.HTTP.LiteralHost != "" {
				continue
			}
			at := a.HTTP.URL.at
			what := "step " + st.Name
			if a == st.Compensate {
				what += "'s compensation"
			}
			out = append(out, Problem{File: s.File, Line: at.Line, Col: at.Col, Msg: fmt.Sprintf(
				"warning: %s builds the host of its http.url from an expression and the file has no egress.allow; "+
					"every call will be refused unless the relay runs with --http-egress-allow naming the hosts: "+
					"add egress: {allow: [...]} or write the host literally", what)})
		}
	}
	return out
}

// buildWhen compiles a step's when: one expression that gives true or
// false, reading what the step's own expressions may read before it acts.
func buildWhen(file string, sm mapping, place string, base scope, r *report) *template {
	wn := sm.get("when")
	if wn == nil {
		return nil
	}
	if wn.Kind != yaml.ScalarNode || !isSingleExpr(wn.Value) {
		r.add(nodeAt(wn), "%s.when must be one expression, \"${ … }\", that gives true or false; write e.g. when: \"${ trigger.payload.amount > 100 }\"", place)
		return nil
	}
	sc := base
	sc.place = place + ".when"
	t := compileTemplate(wn, file, &sc, r)
	if t != nil && t.single != nil && !typeIs(t.single.typ, cel.BoolType) {
		r.add(pos{t.single.line, t.single.col}, "%s.when gives %s, not true or false; compare it, e.g. ${ x > 0 } or ${ x == 'gold' }", place, t.single.typ)
		return nil
	}
	return t
}

// buildWait reads a wait step: duration, or until (one expression giving
// a timestamp or RFC 3339 text).
func buildWait(file string, sm mapping, place string, base scope, r *report) *WaitAction {
	wm := sm.sub("wait")
	if !wm.ok() {
		return nil // the schema reported it
	}
	hasD, hasU := wm.get("duration") != nil, wm.get("until") != nil
	switch {
	case hasD && hasU:
		r.add(wm.keyAt("until"), "%s.wait has both duration and until; keep one", place)
		return nil
	case !hasD && !hasU:
		r.add(sm.keyAt("wait"), "%s.wait says neither how long nor until when; give duration: 2h or until: \"${ … }\" (a timestamp)", place)
		return nil
	}
	wa := &WaitAction{}
	if hasD {
		wa.Duration = wm.duration("duration", r)
		if _, err := time.ParseDuration(wm.str("duration")); err == nil && wa.Duration <= 0 {
			r.add(nodeAt(wm.get("duration")), "%s.wait.duration must be positive; write e.g. duration: 2h", place)
		}
		return wa
	}
	un := wm.get("until")
	if un.Kind != yaml.ScalarNode || !isSingleExpr(un.Value) {
		r.add(nodeAt(un), "%s.wait.until must be one expression, \"${ … }\", that gives a timestamp; write e.g. until: \"${ timestamp(trigger.payload.ship_at) }\"", place)
		return nil
	}
	sc := base
	sc.place = place + ".wait.until"
	wa.Until = compileTemplate(un, file, &sc, r)
	if wa.Until != nil && wa.Until.single != nil {
		if t := wa.Until.single.typ; !typeIs(t, cel.TimestampType) && !typeIs(t, cel.StringType) {
			r.add(pos{wa.Until.single.line, wa.Until.single.col}, "%s.wait.until gives %s, not a timestamp; write ${ timestamp('2030-01-01T00:00:00Z') } or an expression on RFC 3339 text, e.g. ${ timestamp(trigger.payload.ship_at) }", place, t)
			return nil
		}
	}
	return wa
}

// typeIs reports whether t, a checked result type, may be want: it is
// want, or dyn (known only from the data).
func typeIs(t, want *cel.Type) bool {
	if t == nil || t.Kind() == types.DynKind || t.Kind() == types.AnyKind {
		return true
	}
	return t.IsExactType(want)
}

// buildConcurrency reads concurrency: {key, limit}. The key sees only the
// event, as a trigger's filter does: it is computed when the instance
// starts.
func buildConcurrency(file string, m mapping, contracts []*triggerContract, r *report) *ConcurrencyLimit {
	cm := m.sub("concurrency")
	if !cm.ok() {
		return nil
	}
	kn, ln := cm.get("key"), cm.get("limit")
	if kn == nil || ln == nil {
		return nil // the schema reported it
	}
	c := &ConcurrencyLimit{}
	if err := ln.Decode(&c.Limit); err != nil || c.Limit < 1 {
		return nil // the schema reported it
	}
	if kn.Kind != yaml.ScalarNode || !strings.Contains(kn.Value, "${") {
		r.add(nodeAt(kn), "concurrency.key %q is the same for every instance, so they would all run one after the other; key it by the event, e.g. key: \"${ trigger.aggregate_id }\"", kn.Value)
		return nil
	}
	c.Global = cm.str("scope") == "global"
	sc := &scope{place: "concurrency.key", noSteps: true, contracts: contracts}
	c.Key = compileTemplate(kn, file, sc, r)
	if c.Key == nil {
		return nil
	}
	return c
}

// buildRate reads a step's rate: N/s, N/m or N/h, or {limit: N/s, per:
// saga|tenant}. The shorthand is per saga: the limit protects a participant,
// which sees every tenant's calls.
func buildRate(sm mapping, place string, r *report) *saga.Rate {
	n := sm.get("rate")
	if n == nil {
		return nil
	}
	perTenant := false
	what := place + ".rate"
	if n.Kind == yaml.MappingNode {
		rm := mapping{n}
		perTenant = rm.str("per") == "tenant"
		what += ".limit"
		if n = rm.get("limit"); n == nil {
			return nil // the schema reported it
		}
	}
	if n.Kind != yaml.ScalarNode {
		return nil // the schema reported it
	}
	fix := "write how many starts per second, minute or hour, e.g. rate: 50/s, 100/m or 1000/h, or rate: {limit: 50/s, per: tenant}"
	count, unit, ok := strings.Cut(strings.TrimSpace(n.Value), "/")
	per := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	c, err := strconv.Atoi(count)
	switch {
	case !ok || per == 0 || err != nil:
		r.add(nodeAt(n), "%s is %q, not a rate; %s", what, n.Value, fix)
		return nil
	case c < 1 || per/time.Duration(c) < time.Microsecond:
		r.add(nodeAt(n), "%s %q must allow at least 1 and at most 1000000 starts per second; %s", what, n.Value, fix)
		return nil
	}
	return &saga.Rate{Count: c, Per: per, PerTenant: perTenant}
}
