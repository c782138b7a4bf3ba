package saga

import "time"

// NextRateTurn decides one rate turn, the same way for every journal. At
// now, an instance holding turn held (nil: none yet) asks for its turn of a
// key whose next free turn is next and which last let a step run at last
// (nil: never); turns are spaced by every. It returns the instance's turn,
// the key's next free turn and last run afterwards, and whether the step
// runs now (use); otherwise the instance waits for turn.
//
// A turn is reserved ahead of time and may be claimed late (a busy machine,
// a long poll); late turns claimed together would reach the participant
// together. So a turn that has come runs only when a spacing has passed
// since the key last let a step run; otherwise the instance takes the next
// free turn after that. The calls a participant sees are therefore at least
// every apart, whatever the claims' delays.
func NextRateTurn(now time.Time, held *time.Time, next time.Time, last *time.Time, every time.Duration) (turn, nextAt time.Time, lastAt *time.Time, use bool) {
	reserve := func(from time.Time) time.Time {
		t := next
		if from.After(t) {
			t = from
		}
		next = t.Add(every)
		return t
	}
	if held != nil {
		turn = *held
	} else {
		turn = reserve(now)
	}
	if turn.After(now) {
		return turn, next, last, false
	}
	if last != nil && now.Before(last.Add(every)) {
		return reserve(last.Add(every)), next, last, false
	}
	return now, next, &now, true
}
