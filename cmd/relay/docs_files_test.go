package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var yamlBlockRE = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestPagesSagaAndSinkFilesAreValid: every whole saga file, saga test file
// and sinks file the README and docs/ show is accepted as written: `relay
// sagas validate`, `relay sagas test` (its cases pass) and `relay sinks
// validate` exit 0. Fragments (a trigger, a step) are left out.
func TestPagesSagaAndSinkFilesAreValid(t *testing.T) {
	t.Setenv("RELAY_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../../README.md")
	sagas, tests, sinks := 0, 0, 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(page)
		dir := t.TempDir()
		hasSaga, hasTest := false, false
		for i, m := range yamlBlockRE.FindAllStringSubmatch(string(b), -1) {
			body := m[1]
			first := body
			for strings.HasPrefix(first, "#") {
				_, first, _ = strings.Cut(first, "\n")
			}
			switch {
			case strings.HasPrefix(first, "saga:") && strings.Contains(body, "\ncases:"):
				writeFile(t, filepath.Join(dir, "case"+strconv.Itoa(i)+".test.yaml"), body)
				hasTest = true
				tests++
			case strings.HasPrefix(first, "saga:"):
				writeFile(t, filepath.Join(dir, "saga"+strconv.Itoa(i)+".yaml"), body)
				hasSaga = true
				sagas++
			case strings.HasPrefix(first, "sinks:"):
				f := filepath.Join(t.TempDir(), "sinks.yaml")
				writeFile(t, f, body)
				if code := run([]string{"sinks", "validate", f}); code != 0 {
					t.Errorf("%s: the sinks file of its yaml block %d: relay sinks validate exits %d\n%s", name, i+1, code, body)
				}
				sinks++
			}
		}
		if hasSaga {
			if code := run([]string{"sagas", "validate", dir}); code != 0 {
				t.Errorf("%s: relay sagas validate of its saga files exits %d", name, code)
			}
		}
		if hasTest {
			if code := run([]string{"sagas", "test", dir}); code != 0 {
				t.Errorf("%s: relay sagas test of its test files exits %d", name, code)
			}
		}
	}
	if sagas < 2 || tests < 1 || sinks < 2 {
		t.Errorf("found %d saga files, %d test files, %d sinks files in the pages; want the README's and docs/sagas.md's", sagas, tests, sinks)
	}
	t.Logf("%d saga files, %d test files, %d sinks files", sagas, tests, sinks)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
