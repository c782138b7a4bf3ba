package declare

import (
	"fmt"
	"net/url"
	"strings"
)

// urlPlace is where a ${ … } stands in an http step's URL written as text:
// its output is escaped for that place, so that event data fills the one
// path segment or query value the file's author wrote it into and cannot
// add segments, climb with "..", start a query or a fragment, or change the
// host.
type urlPlace int

const (
	// urlStart: before the scheme's "://" and the host: the output gives the
	// start of the URL (its scheme and host), which no escaping can keep in
	// place: it goes in as it is, and a load warns unless it is raw(…).
	urlStart urlPlace = iota
	// urlHost: inside scheme://…: the output must be a host name, an
	// address or a port.
	urlHost
	// urlPath: a path segment: url.PathEscape, and "." and ".." escaped.
	urlPath
	// urlQuery: a query key or value: url.QueryEscape.
	urlQuery
	// urlFragment: after '#': url.QueryEscape (never sent, kept inert).
	urlFragment
)

func (p urlPlace) String() string {
	return [...]string{"the start of the URL", "the host", "a path segment", "the query", "the fragment"}[p]
}

// placeAt says where text appended to prefix, the URL so far, stands.
func placeAt(prefix string) urlPlace {
	i := strings.Index(prefix, "://")
	if i < 0 {
		return urlStart
	}
	rest := prefix[i+3:]
	switch {
	case strings.Contains(rest, "#"):
		return urlFragment
	case strings.Contains(rest, "?"):
		return urlQuery
	case strings.Contains(rest, "/"):
		return urlPath
	}
	return urlHost
}

// escapeFor escapes v, an expression's text, for place p; an error says why
// a value cannot stand there.
func escapeFor(p urlPlace, v string) (string, error) {
	switch p {
	case urlHost:
		for _, r := range v {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".-:[]", r)) {
				return "", fmt.Errorf("gave %q for the host, which holds %q: a host holds only letters, digits, '.', '-', and ':' before a port", v, r)
			}
		}
		if v == "" {
			return "", fmt.Errorf("gave an empty host")
		}
		return v, nil
	case urlPath:
		if strings.Trim(v, ".") == "" && v != "" {
			return strings.Repeat("%2E", len(v)), nil
		}
		return url.PathEscape(v), nil
	case urlQuery, urlFragment:
		return url.QueryEscape(v), nil
	}
	return v, nil
}

// evalURL renders an http step's URL. A URL written as text escapes the
// output of each ${ … } for where it stands (urlPlace), except raw(…); a URL
// that is one expression is that expression's text: it builds the whole
// URL.
func (t *template) evalURL(vars map[string]any) (string, error) {
	if t == nil || !t.isText {
		return t.evalText(vars)
	}
	var b strings.Builder
	for _, p := range t.parts {
		if p.e == nil {
			b.WriteString(p.text)
			continue
		}
		v, err := p.e.eval(vars)
		if err != nil {
			return "", err
		}
		text := textOf(v)
		if !p.e.raw {
			place := placeAt(b.String())
			if text, err = escapeFor(place, text); err != nil {
				return "", fmt.Errorf("%s in the url %s; wrap it in raw(…) only if it is meant to build the URL", p.e, err)
			}
		}
		b.WriteString(text)
	}
	return b.String(), nil
}

// unescapedURLParts lists the expressions of an http URL whose output goes
// in as it is without raw(…): a URL that is one expression, and an
// expression at the start of a URL written as text.
func unescapedURLParts(t *template) []*expr {
	switch {
	case t == nil:
		return nil
	case t.single != nil:
		if t.single.raw {
			return nil
		}
		return []*expr{t.single}
	case !t.isText:
		return nil
	}
	// Only the first expression's place is known at load: the text of the
	// ones after it depends on its output, and they are escaped for where
	// that puts them when the step runs.
	var prefix strings.Builder
	for _, p := range t.parts {
		if p.e == nil {
			prefix.WriteString(p.text)
			continue
		}
		if !p.e.raw && placeAt(prefix.String()) == urlStart {
			return []*expr{p.e}
		}
		return nil
	}
	return nil
}
