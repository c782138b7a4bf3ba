package declare

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrInvalid is the kind of every load error: errors.Is(err, ErrInvalid)
// holds for the Problems a load returns.
var ErrInvalid = errors.New("invalid saga definition")

// Problem is one thing wrong with a definition file, where it is and how to
// fix it. Line and Col are 1-based; 0 when the problem concerns the file as a
// whole.
type Problem struct {
	File string
	Line int
	Col  int
	// Msg reads "what is wrong; how to fix it".
	Msg string
}

func (p Problem) String() string {
	if p.Line == 0 {
		return fmt.Sprintf("%s: %s", p.File, p.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Line, p.Col, p.Msg)
}

// Problems is every problem a load found, ordered by file, line and column.
// As an error it prints one problem per line.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Is makes errors.Is(ps, ErrInvalid) hold.
func (ps Problems) Is(target error) bool { return target == ErrInvalid }

func (ps Problems) sorted() Problems {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
	// The same problem reached twice (a schema rule and a check of ours)
	// is said once.
	out := ps[:0]
	for i, p := range ps {
		if i > 0 && p == ps[i-1] {
			continue
		}
		out = append(out, p)
	}
	return out
}

// pos is a place in a file.
type pos struct{ Line, Col int }

// report collects the problems of one file.
type report struct {
	file string
	list Problems
}

func (r *report) add(at pos, format string, args ...any) {
	r.list = append(r.list, Problem{File: r.file, Line: at.Line, Col: at.Col, Msg: fmt.Sprintf(format, args...)})
}
