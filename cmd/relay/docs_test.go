package main

import (
	"os"
	"strings"
	"testing"

	"github.com/compensa/compensa/internal/docgen"
)

// TestDocsAreGenerated: the reference pages of docs/ (the CLI from this
// command tree, the HTTP API from openapi.json, the file references from
// their JSON Schemas) are what `make docs` writes. `make docs` runs this test
// with COMPENSA_WRITE_DOCS=1, which writes them instead of comparing.
func TestDocsAreGenerated(t *testing.T) {
	files, err := docgen.Files(newRootCmd(&rootOptions{}), "../..")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("COMPENSA_WRITE_DOCS") == "1" {
		if err := docgen.Write(files, "../.."); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d pages", len(files))
		return
	}
	problems, err := docgen.Diff(files, "../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Fatalf("the generated reference is out of date: run make docs\n%s", strings.Join(problems, "\n"))
	}
}
