package declare

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// TestFileSuffix ends the name of a saga test file; LoadDir leaves such
// files out.
const TestFileSuffix = ".test.yaml"

// isTestFile: name is a saga test file (.test.yaml or .test.yml).
func isTestFile(name string) bool {
	n := strings.ToLower(name)
	return strings.HasSuffix(n, ".test.yaml") || strings.HasSuffix(n, ".test.yml")
}

// TestFile is a loaded saga test file: cases of a trigger, what the steps
// get back and the expected outcome.
type TestFile struct {
	File    string
	Saga    string
	Version int
	Cases   []TestCase
}

// TestCase is one case of a test file.
type TestCase struct {
	Name   string
	Input  WalkInput
	Expect TestExpect
	at     pos
}

// TestExpect is a case's expected outcome; the lists are checked when
// given.
type TestExpect struct {
	Status         string    `json:"status"`
	Steps          *[]string `json:"steps"`
	Compensations  *[]string `json:"compensations"`
	Emitted        *[]string `json:"emitted"`
	ReasonContains string    `json:"reason_contains"`
}

// LoadTests loads every test file of dir (*.test.yaml, *.test.yml),
// reporting every problem at once as file:line:col. No test file is no
// error: the list is empty.
func LoadTests(dir string) ([]*TestFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, Problems{{File: dir, Msg: fmt.Sprintf("cannot read the directory: %v", err)}}
	}
	var out []*TestFile
	var probs Problems
	for _, e := range entries {
		if e.IsDir() || !isTestFile(e.Name()) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(name)
		if err != nil {
			probs = append(probs, Problem{File: name, Msg: fmt.Sprintf("cannot read: %v; check its permissions", err)})
			continue
		}
		tf, ps := LoadTestFile(name, b)
		probs = append(probs, ps...)
		if tf != nil {
			out = append(out, tf)
		}
	}
	if len(probs) > 0 {
		return nil, probs.sorted()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, nil
}

// LoadTestFile loads one test file; a trigger given as a path is read
// relative to name.
func LoadTestFile(name string, body []byte) (*TestFile, Problems) {
	r := &report{file: name}
	var doc yaml.Node
	if err := yaml.Unmarshal(body, &doc); err != nil {
		r.add(yamlErrorPos(err), "YAML syntax: %s; fix the syntax", yamlErrorText(err))
		return nil, r.list.sorted()
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		r.add(pos{1, 1}, "the file is not a saga test file (a mapping with saga and cases); see sagatest.schema.json")
		return nil, r.list.sorted()
	}
	root := doc.Content[0]
	dv := newDocValue()
	v := dv.convert(root, "", r, 0)
	checkSchemaOf(testSchemaURL, v, dv, r)
	if len(r.list) > 0 {
		return nil, r.list.sorted()
	}
	m := asMap(v)
	tf := &TestFile{File: name}
	tf.Saga, _ = m["saga"].(string)
	if n, ok := m["version"].(int64); ok {
		tf.Version = int(n)
	}
	caseNodes := mapping{root}.list("cases")
	for i, cv := range m["cases"].([]any) {
		c := asMap(cv)
		tc := TestCase{Input: WalkInput{}}
		tc.Name, _ = c["name"].(string)
		if i < len(caseNodes) {
			tc.at = nodeAt(caseNodes[i])
		}
		place := fmt.Sprintf("cases[%d]", i)
		switch t := c["trigger"].(type) {
		case string:
			p := t
			if !filepath.IsAbs(p) {
				p = filepath.Join(filepath.Dir(name), p)
			}
			b, err := os.ReadFile(p)
			if err != nil || !json.Valid(b) {
				why := "it is not JSON"
				if err != nil {
					why = err.Error()
				}
				r.add(tc.at, "%s.trigger: cannot use %s: %s; give the trigger inline or the path of a JSON file, relative to this file", place, t, why)
				continue
			}
			tc.Input.Trigger = b
		default:
			tc.Input.Trigger, _ = json.Marshal(t)
		}
		for key, dst := range map[string]*map[string]json.RawMessage{"rows": &tc.Input.Rows, "responses": &tc.Input.Responses, "replies": &tc.Input.Replies} {
			for step, x := range asMap(c[key]) {
				if *dst == nil {
					*dst = map[string]json.RawMessage{}
				}
				b, _ := json.Marshal(x)
				if key == "responses" {
					// A response given without a body answers {}.
					if _, has := asMap(x)["body"]; !has {
						rm := asMap(x)
						rm["body"] = map[string]any{}
						b, _ = json.Marshal(rm)
					}
				}
				(*dst)[step] = b
			}
		}
		tc.Input.Fail, _ = c["fail"].(string)
		eb, _ := json.Marshal(c["expect"])
		if err := json.Unmarshal(eb, &tc.Expect); err != nil {
			r.add(tc.at, "%s.expect: %v; see sagatest.schema.json", place, err)
			continue
		}
		tf.Cases = append(tf.Cases, tc)
	}
	if len(r.list) > 0 {
		return nil, r.list.sorted()
	}
	return tf, nil
}

// RunTests runs every case of files against the sagas they name and writes
// PASS or FAIL per case, with what differs and the walk of a failing case.
// It returns how many passed and failed.
func RunTests(w io.Writer, sagas []*Saga, files []*TestFile) (passed, failed int) {
	for _, tf := range files {
		s := pickSaga(sagas, tf.Saga, tf.Version)
		if s == nil {
			failed += len(tf.Cases)
			fmt.Fprintf(w, "FAIL %s: no saga %s%s in the directory; name one of: %s\n", tf.File, tf.Saga, versionText(tf.Version), strings.Join(sagaNames(sagas), ", "))
			continue
		}
		for _, c := range tf.Cases {
			var walk bytes.Buffer
			res, err := Walk(s, c.Input, &walk)
			var diffs []string
			if err != nil {
				diffs = append(diffs, "the case cannot run: "+err.Error())
			} else {
				diffs = c.Expect.diff(res)
			}
			where := fmt.Sprintf("%s:%d:%d", tf.File, c.at.Line, c.at.Col)
			if len(diffs) == 0 {
				passed++
				fmt.Fprintf(w, "PASS %s %s (%s)\n", where, c.Name, res.Status)
				continue
			}
			failed++
			fmt.Fprintf(w, "FAIL %s %s\n", where, c.Name)
			for _, d := range diffs {
				fmt.Fprintf(w, "    %s\n", d)
			}
			fmt.Fprintf(w, "    the walk:\n")
			for _, line := range strings.Split(strings.TrimRight(walk.String(), "\n"), "\n") {
				fmt.Fprintf(w, "      %s\n", line)
			}
		}
	}
	return passed, failed
}

// diff lists what the outcome has other than expected, as want/got lines.
func (e TestExpect) diff(res WalkResult) []string {
	var out []string
	if e.Status != res.Status {
		out = append(out, fmt.Sprintf("status: want %s, got %s", e.Status, res.Status))
	}
	for _, l := range []struct {
		name string
		want *[]string
		got  []string
	}{{"steps", e.Steps, res.Steps}, {"compensations", e.Compensations, res.Compensations}, {"emitted", e.Emitted, res.Emitted}} {
		if l.want != nil && !slices.Equal(*l.want, l.got) {
			out = append(out, fmt.Sprintf("%s: want [%s], got [%s]", l.name, strings.Join(*l.want, ", "), strings.Join(l.got, ", ")))
		}
	}
	if e.ReasonContains != "" && !strings.Contains(res.Reason, e.ReasonContains) {
		out = append(out, fmt.Sprintf("reason: want one containing %q, got %q", e.ReasonContains, res.Reason))
	}
	return out
}

func pickSaga(sagas []*Saga, name string, version int) *Saga {
	var best *Saga
	for _, s := range sagas {
		if s.Name != name {
			continue
		}
		if version != 0 && s.Version == version {
			return s
		}
		if version == 0 && (best == nil || s.Version > best.Version) {
			best = s
		}
	}
	return best
}

func versionText(v int) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf(" version %d", v)
}

func sagaNames(sagas []*Saga) []string {
	var out []string
	for _, s := range sagas {
		out = append(out, fmt.Sprintf("%s (v%d)", s.Name, s.Version))
	}
	return out
}
