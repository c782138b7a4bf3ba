package httpapi

import (
	"net/http"
	"unicode/utf8"
)

// The definitions page draws each loaded saga as a picture: its steps in
// order left to right, each step's compensation under it, and the
// compensations chained right to left, the order in which they run when a
// later step fails. The layout is computed here and drawn by definitionArticle
// (page_definitions.templ) as inline SVG, so the page needs no script and the
// CSP stays as it is; every name is text in the component, escaped there
// (names come from files, or from Go code).

// Sizes of the picture, in SVG user units.
const (
	picBoxW   = 160
	picBoxH   = 48
	picGap    = 44
	picMargin = 12
	picCompY  = picMargin + picBoxH + 56
	picHeight = picCompY + picBoxH + picMargin
	// picNameRunes bounds a name inside a box; the full name is the box's
	// tooltip and is in the list next to the picture.
	picNameRunes = 19
)

// stepBox is one step of the picture, with its compensation (if any).
type stepBox struct {
	No         int
	Name, Kind string
	W, H       int    // the box's size
	Label      string // Name, shortened to fit the box
	X, Y       int
	// CX is the centre of the box; the dashed line to the compensation
	// and the arrow heads are drawn from it.
	CX, MidY int
	Bottom   int // where the dashed line down to the compensation starts
	HasComp  bool
	Comp     string // the compensation's kind
	CompY    int
	CompMidY int
	// CompOrder is the compensation's place in the reverse run (1 = runs
	// first when the last step fails).
	CompOrder int
}

// arrow is a straight arrow from (X1,Y1) to (X2,Y2) with its head as a
// polygon (SVG markers would need document-unique ids per picture).
type arrow struct {
	X1, Y1, X2, Y2 int
	Head           string
}

type definitionPicture struct {
	Definition
	ID            int
	Width, Height int
	Steps         []stepBox
	Forward       []arrow
	Backward      []arrow
	Compensations int
}

func rightArrow(x1, x2, y int) arrow {
	return arrow{X1: x1, Y1: y, X2: x2 - 1, Y2: y, Head: pts(x2, y, x2-8, y-5, x2-8, y+5)}
}

func leftArrow(x1, x2, y int) arrow {
	return arrow{X1: x1, Y1: y, X2: x2 + 1, Y2: y, Head: pts(x2, y, x2+8, y-5, x2+8, y+5)}
}

func pts(v ...int) string {
	b := make([]byte, 0, 32)
	for i := 0; i < len(v); i += 2 {
		if i > 0 {
			b = append(b, ' ')
		}
		b = appendInt(b, v[i])
		b = append(b, ',')
		b = appendInt(b, v[i+1])
	}
	return string(b)
}

func appendInt(b []byte, n int) []byte {
	if n < 0 {
		b = append(b, '-')
		n = -n
	}
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// shorten cuts s to n runes with an ellipsis.
func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func newDefinitionPicture(i int, d Definition) definitionPicture {
	p := definitionPicture{Definition: d, ID: i, Height: picHeight}
	n := len(d.Steps)
	p.Width = 2*picMargin + max(n, 1)*picBoxW + max(n-1, 0)*picGap
	for j, st := range d.Steps {
		x := picMargin + j*(picBoxW+picGap)
		b := stepBox{No: j, Name: st.Name, Kind: st.Kind, Label: shorten(st.Name, picNameRunes),
			X: x, Y: picMargin, W: picBoxW, H: picBoxH, CX: x + picBoxW/2, MidY: picMargin + picBoxH/2, Bottom: picMargin + picBoxH,
			HasComp: st.Compensate != "", Comp: st.Compensate, CompY: picCompY, CompMidY: picCompY + picBoxH/2}
		if b.HasComp {
			p.Compensations++
		}
		p.Steps = append(p.Steps, b)
		if j > 0 {
			p.Forward = append(p.Forward, rightArrow(x-picGap, x, b.MidY))
		}
	}
	// Compensations run in reverse: chain each one to the previous step's
	// compensation that exists, pointing left.
	order, next := 0, -1
	for j := n - 1; j >= 0; j-- {
		if !p.Steps[j].HasComp {
			continue
		}
		order++
		p.Steps[j].CompOrder = order
		if next >= 0 {
			p.Backward = append(p.Backward, leftArrow(p.Steps[next].X, p.Steps[j].X+picBoxW, p.Steps[j].CompMidY))
		}
		next = j
	}
	return p
}

type definitionsData struct {
	layoutData
	Pictures []definitionPicture
}

// definitionsPage is GET /definitions: the loaded definitions as pictures.
func (s *Server) definitionsPage(w http.ResponseWriter, r *http.Request) {
	d := definitionsData{layoutData: s.layout(r, "Saga definitions")}
	for i, def := range s.loadedDefinitions() {
		d.Pictures = append(d.Pictures, newDefinitionPicture(i, def))
	}
	s.render(w, r, definitionsView(d), http.StatusOK)
}
