//go:build chaos

package chaos

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// scenarioHygiene checks, from the source, that every package with tests
// has a TestMain that checks for leaked goroutines (goleak directly, or
// pgtest.Main, which calls goleak.Find), and that `make test` runs the tests
// with -race.
func scenarioHygiene(t *testing.T, r *report) {
	root := repoRoot()
	pkgs := map[string][]string{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") && p != root {
			return filepath.SkipDir
		}
		// A folder with a go.mod of its own (bench/peers, deploy/check) is
		// another module: `go test ./...` in make test does not run it.
		if d.IsDir() && p != root {
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if !d.IsDir() && strings.HasSuffix(p, "_test.go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			pkgs[rel] = append(pkgs[rel], p)
		}
		return nil
	})
	var names, missing []string
	for dir, files := range pkgs {
		names = append(names, dir)
		if !leakChecked(files) {
			missing = append(missing, "./"+dir)
		}
	}
	sort.Strings(names)
	sort.Strings(missing)
	mk, _ := os.ReadFile(filepath.Join(root, "Makefile"))
	race := regexp.MustCompile(`(?m)^test:.*\n(\t.*\n)*\t.*\btest\b.*-race`).Match(mk)
	r.figure("packages with tests", "%d", len(names))
	r.figure("without goleak in TestMain", "%d: %s", len(missing), strings.Join(missing, ", "))
	r.expect(len(missing) == 0, "goleak in every test package's TestMain", "%d missing", len(missing))
	r.expect(race, "`make test` runs go test -race", "%t", race)
	r.head = fmt.Sprintf("%d of %d test packages check for leaked goroutines; -race in make test: %t", len(names)-len(missing), len(names), race)
}

// leakChecked reports whether one of files declares a TestMain whose body
// calls goleak, pgtest.Main or pgtest.Finish (Main's leak check after m.Run).
func leakChecked(files []string) bool {
	fset := token.NewFileSet()
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		af, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		for _, decl := range af.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "TestMain" || fn.Recv != nil || fn.Body == nil {
				continue
			}
			body := string(src[fset.Position(fn.Body.Pos()).Offset:fset.Position(fn.Body.End()).Offset])
			if strings.Contains(body, "goleak.") || strings.Contains(body, "pgtest.Main(") || strings.Contains(body, "pgtest.Finish(") {
				return true
			}
		}
	}
	return false
}
