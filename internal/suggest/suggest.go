// Package suggest finds the known word a mistyped one was meant to be, for
// the "did you mean" of the CLI's flags and words, the sinks file's keys and
// the saga definitions' keys. It holds the one edit distance they share;
// the CLI's commands use cobra's own suggestions.
package suggest

import "strings"

// Distance is the number of edits that turn a into b: a letter inserted,
// deleted or replaced, or two neighbouring letters swapped ("lsit" is one
// edit from "list", the typo people make most).
func Distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// Three rows of the table suffice: a swap looks two rows back.
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}

// Nearest returns the choice got was most likely meant to be, or "" when
// none is near enough: case aside, within two edits (a third of the word's
// length for long words), or got being the start of the choice (two letters
// at least). A tie goes to the earlier choice.
func Nearest(got string, choices []string) string {
	best, bestD := "", 1<<30
	lower := strings.ToLower(got)
	for _, c := range choices {
		d := Distance(lower, strings.ToLower(c))
		if len(got) >= 2 && strings.HasPrefix(c, got) {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || bestD > max(2, len(got)/3) {
		return ""
	}
	return best
}
