package httpapi_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTemplGenerated: the committed *_templ.go files are what `go tool templ
// generate` (the version go.mod's tool directive pins) writes from the
// page's .templ files, and each has its .templ. `make docs` regenerates
// them. templ's own check compares in memory and writes nothing; it is
// told to keep orphans, which it would otherwise delete from the tree, and
// this test reports them instead.
func TestTemplGenerated(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "tool", "templ", "generate", "-check", "-keep-orphaned-files", "-path", ".").CombinedOutput()
	if err != nil {
		t.Errorf("the page's generated templ code is out of date: run make docs\n%v\n%s", err, out)
	}
	generated, err := filepath.Glob("*_templ.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(generated) == 0 {
		t.Fatal("no *_templ.go file here: the page's components are not generated")
	}
	for _, g := range generated {
		src := strings.TrimSuffix(g, "_templ.go") + ".templ"
		if _, err := os.Stat(src); err != nil {
			t.Errorf("%s has no %s: delete it, or run make docs (which deletes it)", g, src)
		}
	}
}
