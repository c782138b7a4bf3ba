package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The README's command and flag tables are the CLI's documentation: this test
// holds them to the command tree. Every flag of every command is documented
// under that command (shared flags in "Global flags" with the command in its
// commands column, run's own in "`relay run` flags", the others in "Flags of
// the other commands"), with the CLI's default, and nothing is documented that
// the CLI does not have.

const (
	globalHeading = "### Global flags"
	runHeading    = "### `relay run` flags"
	otherHeading  = "### Flags of the other commands"
	cmdHeading    = "## Commands"
)

// readmeTable returns the rows (cells, trimmed) of the first table after
// heading.
func readmeTable(t *testing.T, readme, heading string) [][]string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no heading %q", heading)
	}
	var rows [][]string
	started := false
	for _, line := range strings.Split(readme[i+len(heading)+2:], "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if started {
				break
			}
			if strings.HasPrefix(line, "#") {
				break
			}
			continue
		}
		started = true
		cells := splitRow(line)
		if len(cells) > 0 && strings.Trim(cells[0], "-: ") == "" {
			continue // the |---| line
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		t.Fatalf("README.md: no table under %q", heading)
	}
	return rows[1:] // without the header
}

// splitRow splits a markdown table row on |, except \| and | inside backticks.
func splitRow(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case c == '`':
			inCode = !inCode
			cur.WriteByte(c)
		case c == '|' && !inCode:
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

var codeRE = regexp.MustCompile("`([^`]*)`")

// codes returns the backticked parts of a cell.
func codes(cell string) []string {
	var out []string
	for _, m := range codeRE.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// docFlag is one flag as a README table documents it for one command.
type docFlag struct {
	name, short, def, where string
}

func parseFlagCell(cell string) (name, short string) {
	for _, c := range codes(cell) {
		switch {
		case strings.HasPrefix(c, "--"):
			name = strings.TrimPrefix(c, "--")
		case strings.HasPrefix(c, "-"):
			short = strings.TrimPrefix(c, "-")
		}
	}
	return name, short
}

// sameDefault compares a README default with the CLI's: "—" and "off" stand
// for an empty, false or zero default; durations compare as durations.
func sameDefault(readme, cli string) bool {
	r := strings.Trim(strings.TrimSpace(readme), "`")
	if r == "—" || r == "off" || r == "-" {
		r = ""
	}
	switch cli {
	case "false", "0", "0s", "[]":
		cli = ""
	}
	if r == cli {
		return true
	}
	rd, err1 := time.ParseDuration(r)
	cd, err2 := time.ParseDuration(cli)
	return err1 == nil && err2 == nil && rd == cd
}

func TestREADMEFlagTablesMatchTheCLI(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	root, _ := cliTree()

	// Every command a user can call: not hidden, not a group, not help.
	leaves := map[string]*cobra.Command{}
	walk(root, func(c *cobra.Command) {
		if c.Hidden || isGroup(c) || c == root {
			return
		}
		for p := c.Parent(); p != nil; p = p.Parent() {
			if p.Hidden {
				return
			}
		}
		leaves[strings.TrimPrefix(c.CommandPath(), "relay ")] = c
	})

	// What the README documents, per command.
	docs := map[string]map[string]docFlag{}
	document := func(cmd string, f docFlag) {
		if docs[cmd] == nil {
			docs[cmd] = map[string]docFlag{}
		}
		if prev, dup := docs[cmd][f.name]; dup {
			t.Errorf("README.md documents --%s of `relay %s` twice (%s and %s)", f.name, cmd, prev.where, f.where)
		}
		docs[cmd][f.name] = f
	}
	for _, row := range readmeTable(t, readme, globalHeading) {
		if len(row) < 4 {
			t.Errorf("README.md %q: row %v needs 4 columns (flag, default, commands, meaning)", globalHeading, row)
			continue
		}
		name, short := parseFlagCell(row[0])
		if !slices.Contains(sharedFlags, name) {
			t.Errorf("README.md %q documents --%s, which is not a global flag: move it to the table of the command that has it", globalHeading, name)
		}
		for _, cmd := range codes(row[2]) {
			cmd = strings.TrimPrefix(cmd, "relay ")
			document(cmd, docFlag{name, short, row[1], fmt.Sprintf("%q, commands column of --%s", globalHeading, name)})
		}
	}
	for _, row := range readmeTable(t, readme, runHeading) {
		name, short := parseFlagCell(row[0])
		if slices.Contains(sharedFlags, name) {
			t.Errorf("README.md %q documents --%s, a global flag: list `run` in its commands column under %q instead", runHeading, name, globalHeading)
		}
		document("run", docFlag{name, short, row[1], fmt.Sprintf("%q", runHeading)})
	}
	for _, row := range readmeTable(t, readme, otherHeading) {
		if len(row) < 3 {
			t.Errorf("README.md %q: row %v needs command, flag, default", otherHeading, row)
			continue
		}
		cs := codes(row[0])
		if len(cs) != 1 {
			t.Errorf("README.md %q: row %v: the command column must hold one `relay ...`", otherHeading, row)
			continue
		}
		prefix := strings.TrimPrefix(cs[0], "relay ")
		name, short := parseFlagCell(row[1])
		// A row for a group (`relay sagas`) documents a flag every command
		// of the group has.
		matched := false
		for path := range leaves {
			if path == prefix || strings.HasPrefix(path, prefix+" ") {
				document(path, docFlag{name, short, row[2], fmt.Sprintf("%q, row %s --%s", otherHeading, cs[0], name)})
				matched = true
			}
		}
		if !matched {
			t.Errorf("README.md %q documents --%s for `%s`, which is not a command", otherHeading, name, cs[0])
		}
	}

	var paths []string
	for p := range leaves {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, path := range paths {
		c := leaves[path]
		have := map[string]*pflag.Flag{}
		collect := func(f *pflag.Flag) {
			if f.Name != "help" && !f.Hidden {
				have[f.Name] = f
			}
		}
		c.Flags().VisitAll(collect)
		c.InheritedFlags().VisitAll(collect)
		for name, f := range have {
			d, ok := docs[path][name]
			switch {
			case !ok && slices.Contains(sharedFlags, name):
				t.Errorf("README.md: global flag --%s of `relay %s` is not documented for it: add `%s` to the commands column of --%s under %q", name, path, path, name, globalHeading)
			case !ok && path == "run":
				t.Errorf("README.md: flag --%s of `relay run` is not documented: add a row | `--%s` | `%s` | ... | to the table under %q", name, name, f.DefValue, runHeading)
			case !ok:
				t.Errorf("README.md: flag --%s of `relay %s` is not documented: add a row | `relay %s` | `--%s` | `%s` | ... | to the table under %q", name, path, path, name, f.DefValue, otherHeading)
			case !sameDefault(d.def, f.DefValue):
				t.Errorf("README.md (%s): --%s of `relay %s` defaults to %s, the CLI to %q", d.where, name, path, d.def, f.DefValue)
			case d.short != f.Shorthand:
				t.Errorf("README.md (%s): --%s of `relay %s` has shorthand %q, the CLI %q", d.where, name, path, d.short, f.Shorthand)
			}
		}
		for name, d := range docs[path] {
			if _, ok := have[name]; !ok {
				t.Errorf("README.md (%s) documents --%s for `relay %s`, which has no such flag: remove it", d.where, name, path)
			}
		}
	}
	for cmd := range docs {
		if leaves[cmd] == nil {
			t.Errorf("README.md documents flags for `relay %s`, which is not a command", cmd)
		}
	}

	// The commands table names every command, and only commands.
	listed := map[string]bool{}
	for _, row := range readmeTable(t, readme, cmdHeading) {
		cs := codes(row[0])
		if len(cs) == 0 || !strings.HasPrefix(cs[0], "relay ") {
			t.Errorf("README.md %q: row %v does not start with `relay ...`", cmdHeading, row)
			continue
		}
		words := strings.Fields(strings.TrimPrefix(cs[0], "relay "))
		// The command path is the leading words that name commands.
		c, path := root, ""
		for _, w := range words {
			next := findSubcommand(c, w)
			if next == nil {
				break
			}
			c, path = next, strings.TrimSpace(path+" "+w)
		}
		if path == "" || isGroup(c) {
			t.Errorf("README.md %q: `%s` does not name a command", cmdHeading, cs[0])
			continue
		}
		listed[path] = true
	}
	for _, path := range paths {
		if !listed[path] {
			t.Errorf("README.md: command `relay %s` is missing from the table under %q", path, cmdHeading)
		}
	}
	if !t.Failed() {
		t.Logf("%d commands and their flags match README.md", len(paths))
	}
}
