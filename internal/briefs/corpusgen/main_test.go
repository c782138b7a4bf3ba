package main

import (
	"bytes"
	"os"
	"testing"
)

// The committed SQL file is what ships: it must be exactly what the generator
// writes, or someone edited one without the other.
func TestCommittedCorpusIsGenerated(t *testing.T) {
	t.Parallel()
	got, err := os.ReadFile("../../../migrations/examples/0002_documents.sql")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, Generate()) {
		t.Fatal("migrations/examples/0002_documents.sql differs from the generator's output: run `go generate ./internal/briefs` and commit the result")
	}
}

func TestCorpusIsLargeAndDistinct(t *testing.T) {
	t.Parallel()
	docs := Documents()
	if len(docs) < 200 {
		t.Fatalf("corpus has %d documents, want at least 200", len(docs))
	}
	ids, titles, bodies := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, d := range docs {
		if ids[d.ID.String()] || titles[d.Title] || bodies[d.Body] {
			t.Fatalf("duplicate document: %+v", d)
		}
		ids[d.ID.String()], titles[d.Title], bodies[d.Body] = true, true, true
		if bytes.ContainsAny([]byte(d.Body), "{}") {
			t.Fatalf("unfilled placeholder in %q", d.Body)
		}
	}
	if !bytes.Equal(Generate(), Generate()) {
		t.Fatal("two runs of the generator differ")
	}
}
