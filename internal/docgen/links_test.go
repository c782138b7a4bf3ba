package docgen

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	fenceRE   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
)

// anchors returns the anchors of a Markdown file's headings, as GitHub
// makes them (a repeated heading gets -1, -2, ...).
func anchors(text string) map[string]bool {
	text = fenceRE.ReplaceAllString(text, "")
	out := map[string]bool{}
	for _, m := range headingRE.FindAllStringSubmatch(text, -1) {
		a := anchor(strings.TrimSpace(m[1]))
		for i := 1; out[a]; i++ {
			a = anchor(strings.TrimSpace(m[1])) + "-" + string(rune('0'+i))
		}
		out[a] = true
	}
	return out
}

// TestLinksResolve: every relative link of the README, the other top-level
// pages and docs/ names a file of the repository, and every #anchor a
// heading of the page it points to.
func TestLinksResolve(t *testing.T) {
	const repo = "../.."
	var pages []string
	for _, g := range []string{"*.md", "docs/*.md", "docs/*/*.md"} {
		m, err := filepath.Glob(filepath.Join(repo, g))
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	if len(pages) < 10 {
		t.Fatalf("found %d pages", len(pages))
	}
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := cache[path]; ok {
			return a
		}
		b, _ := os.ReadFile(path)
		cache[path] = anchors(string(b))
		return cache[path]
	}
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := fenceRE.ReplaceAllString(string(b), "")
		rel, _ := filepath.Rel(repo, page)
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %s: no such file", rel, target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: link %s: no heading with anchor #%s there", rel, target, frag)
			}
			checked++
		}
	}
	t.Logf("%d links in %d pages resolve", checked, len(pages))
}
