package declare

import (
	"bytes"
	_ "embed"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/compensa/compensa/internal/suggest"
)

// Schema is the JSON Schema of a saga definition file. The loader validates
// every file against it before its own checks, and editors can use it
// (`# yaml-language-server: $schema=saga.schema.json`).
//
//go:embed saga.schema.json
var Schema []byte

// TestSchema is the JSON Schema of a saga test file (*.test.yaml), which
// `relay sagas test DIR` runs.
//
//go:embed sagatest.schema.json
var TestSchema []byte

const (
	sagaSchemaURL = "saga.schema.json"
	testSchemaURL = "sagatest.schema.json"
)

// builtSchema is one of the built-in schemas, compiled once.
type builtSchema struct {
	once sync.Once
	body []byte
	doc  map[string]any
	comp *jsonschema.Schema
	err  error
}

var schemas = map[string]*builtSchema{
	sagaSchemaURL: {body: Schema},
	testSchemaURL: {body: TestSchema},
}

func (b *builtSchema) compile(url string) (*jsonschema.Schema, error) {
	b.once.Do(func() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b.body))
		if err != nil {
			b.err = fmt.Errorf("%s: %w", url, err)
			return
		}
		b.doc, _ = doc.(map[string]any)
		c := jsonschema.NewCompiler()
		if err := c.AddResource(url, doc); err != nil {
			b.err = err
			return
		}
		b.comp, b.err = c.Compile(url)
	})
	return b.comp, b.err
}

func compiledSchema() (*jsonschema.Schema, error) {
	return schemas[sagaSchemaURL].compile(sagaSchemaURL)
}

var printer = message.NewPrinter(language.English)

// checkSchema validates v against the saga schema and reports each leaf
// error at the place it concerns.
func checkSchema(v any, d *docValue, r *report) { checkSchemaOf(sagaSchemaURL, v, d, r) }

// checkSchemaOf validates v against the built-in schema url.
func checkSchemaOf(url string, v any, d *docValue, r *report) {
	sch, err := schemas[url].compile(url)
	if err != nil {
		r.add(pos{}, "the built-in schema does not compile: %v; report this as a bug", err)
		return
	}
	err = sch.Validate(v)
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return
	}
	var leaves []*jsonschema.ValidationError
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	for _, e := range leaves {
		schemaProblem(e, d, r)
	}
}

func pointerOf(loc []string) string {
	p := ""
	for _, t := range loc {
		p = pointerJoin(p, t)
	}
	return p
}

// where names a place in the document for a person: "steps[1].http".
func where(loc []string) string {
	if len(loc) == 0 {
		return "the file"
	}
	var b strings.Builder
	for _, t := range loc {
		if t != "" && strings.Trim(t, "0123456789") == "" {
			b.WriteString("[" + t + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(t)
	}
	return b.String()
}

func schemaProblem(e *jsonschema.ValidationError, d *docValue, r *report) {
	ptr := pointerOf(e.InstanceLocation)
	at := pos{}
	if n := d.values[ptr]; n != nil {
		at = nodeAt(n)
	}
	w := where(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		allowed := allowedKeys(e.SchemaURL)
		for _, p := range k.Properties {
			kp := at
			if kn := d.keys[pointerJoin(ptr, p)]; kn != nil {
				kp = nodeAt(kn)
			}
			fix := "remove it"
			if len(allowed) > 0 {
				fix = "remove it or use one of: " + strings.Join(allowed, ", ")
			}
			if s := closest(p, allowed); s != "" {
				fix = fmt.Sprintf("did you mean %q?", s)
			}
			r.add(kp, "unknown key %q in %s; %s", p, w, fix)
		}
	case *kind.Required:
		for _, m := range k.Missing {
			r.add(at, "missing key %q in %s; add it", m, w)
		}
	case *kind.Type:
		r.add(at, "%s must be %s, not %s; %s", w, strings.Join(k.Want, " or "), k.Got, typeFix(k.Want))
	case *kind.Enum:
		var want []string
		for _, x := range k.Want {
			want = append(want, fmt.Sprint(x))
		}
		r.add(at, "%s is %v; use one of: %s", w, k.Got, strings.Join(want, ", "))
	case *kind.Pattern:
		switch {
		case strings.HasSuffix(e.SchemaURL, "/duration/pattern") || strings.Contains(e.SchemaURL, "duration"):
			r.add(at, "%s is %q, not a duration; write a Go duration such as 200ms, 10s or 2m", w, k.Got)
		case strings.Contains(e.SchemaURL, "errorCodes"):
			r.add(at, "%s is %q, not a SQLSTATE; write a five-character code such as \"23505\", a two-character class such as \"40\", or an HTTP status as a number", w, k.Got)
		case strings.Contains(e.SchemaURL, "stepName"):
			r.add(at, "step name %q is not an identifier; use letters, digits and _ (it is read as steps.<name> in expressions)", k.Got)
		default:
			r.add(at, "%s %q is not a valid name; start with a letter and use letters, digits, _ . -", w, k.Got)
		}
	case *kind.MinItems:
		r.add(at, "%s is empty; give it at least %d item(s)", w, k.Want)
	case *kind.Minimum:
		r.add(at, "%s is %s; it must be at least %s", w, k.Got.RatString(), k.Want.RatString())
	case *kind.MinLength:
		r.add(at, "%s is empty; give it a value", w)
	default:
		r.add(at, "%s: %s; see saga.schema.json", w, e.ErrorKind.LocalizedString(printer))
	}
}

func typeFix(want []string) string {
	switch strings.Join(want, ",") {
	case "object":
		return "write a mapping (key: value lines)"
	case "array":
		return "write a list (- item lines)"
	case "string":
		return "quote the value"
	case "integer":
		return "write a whole number"
	case "number":
		return "write a number"
	}
	return "see saga.schema.json"
}

// allowedKeys lists the properties of the schema object whose
// additionalProperties refused a key, for the message.
func allowedKeys(schemaURL string) []string {
	url, frag, ok := strings.Cut(schemaURL, "#")
	b := schemas[path.Base(url)] // the compiler makes the URL absolute
	if !ok || b == nil || b.doc == nil {
		return nil
	}
	frag = strings.TrimSuffix(frag, "/additionalProperties")
	var cur any = b.doc
	for _, t := range strings.Split(strings.TrimPrefix(frag, "/"), "/") {
		if t == "" {
			continue
		}
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[t]
	}
	m, _ := cur.(map[string]any)
	props, _ := m["properties"].(map[string]any)
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// closest returns the allowed key within edit distance 2 of k, if one is.
// A key longer than any allowed one by far is no typo of it, and is not
// measured: a file may hold anything.
func closest(k string, allowed []string) string {
	if len(k) > 64 {
		return ""
	}
	best, bestD := "", 3
	for _, a := range allowed {
		if d := suggest.Distance(k, a); d < bestD {
			best, bestD = a, d
		}
	}
	return best
}
