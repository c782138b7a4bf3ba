package cliflag

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Pairs is a repeatable KEY=VALUE flag gathered into a map (--tenant-weight
// TENANT_ID=N, --rows step=JSON). Each pair is parsed when it is given; a
// key given twice is refused rather than one of its values dropped.
type Pairs[K comparable, V any] struct {
	m     *map[K]V
	typ   string
	want  string
	parse func(key, value string) (K, V, bool)
}

// NewPairs returns a Pairs that stores into m, which starts empty; typ
// names a pair in --help ("tenant=weight"), want says what a pair is, and
// parse reads one (false: refused).
func NewPairs[K comparable, V any](m *map[K]V, typ, want string, parse func(key, value string) (K, V, bool)) *Pairs[K, V] {
	*m = nil
	return &Pairs[K, V]{m: m, typ: typ, want: want, parse: parse}
}

func (p *Pairs[K, V]) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New(p.want)
	}
	key, val, ok := p.parse(k, v)
	if !ok {
		return errors.New(p.want)
	}
	if _, dup := (*p.m)[key]; dup {
		return fmt.Errorf("want each key once: %v is given twice", key)
	}
	if *p.m == nil {
		*p.m = map[K]V{}
	}
	(*p.m)[key] = val
	return nil
}

func (p *Pairs[K, V]) Want() string { return p.want }
func (p *Pairs[K, V]) Type() string { return p.typ }

// String lists the pairs, sorted; "" when there are none, so that --help
// shows no default.
func (p *Pairs[K, V]) String() string {
	pairs := make([]string, 0, len(*p.m))
	for k, v := range *p.m {
		pairs = append(pairs, fmt.Sprintf("%v=%v", k, v))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}
