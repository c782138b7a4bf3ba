package declare

import (
	"context"
	"fmt"

	"github.com/compensa/compensa/saga"
)

// Install loads every definition of dir (secrets required), pins them in the
// database (Pin) and registers them, with the older versions their running
// instances need, in reg. A saga name that reg already holds (a saga defined
// in Go) is refused: one name, one source. On any problem nothing is
// registered and the error is Problems.
func Install(ctx context.Context, db Beginner, reg *saga.Registry, dir string, rt *Runtime) ([]*Saga, error) {
	return Reload(ctx, db, reg, dir, rt, nil)
}

func rtLookup(rt *Runtime) func(string) (string, bool) {
	if rt == nil {
		return nil
	}
	return rt.LookupEnv
}

// Reload re-reads dir and, when the whole set is valid and pinned, replaces
// the declared sagas of prev (none for Install) in reg with it in one step
// (saga.Registry.Swap):
// new triggers route to the new set from the next batch on. On any problem
// nothing changes, prev keeps running, and the error is Problems (or a
// database error). It returns the new set.
func Reload(ctx context.Context, db Beginner, reg *saga.Registry, dir string, rt *Runtime, prev []*Saga) ([]*Saga, error) {
	loaded, err := LoadDir(dir, Options{RequireSecrets: true, LookupEnv: rtLookup(rt)})
	if err != nil {
		return nil, err
	}
	mine := map[string]bool{}
	var old []saga.Key
	for _, s := range prev {
		mine[s.Name] = true
		old = append(old, saga.Key{Name: s.Name, Version: s.Version})
	}
	var probs Problems
	for _, s := range loaded {
		if _, taken := reg.Latest(s.Name); taken && !mine[s.Name] {
			probs = append(probs, Problem{File: s.File, Line: s.namePos.Line, Col: s.namePos.Col,
				Msg: fmt.Sprintf("saga %s is also defined in Go in this relay; rename one of them (a name has one source)", s.Name)})
		}
	}
	if len(probs) > 0 {
		return nil, probs.sorted()
	}
	all, err := Pin(ctx, db, loaded)
	if err != nil {
		return nil, err
	}
	defs := make([]saga.Definition, len(all))
	for i, s := range all {
		defs[i] = s.Definition(rt)
	}
	if err := reg.Swap(old, defs); err != nil {
		return nil, err
	}
	return all, nil
}
