package journaltest

import (
	"sync"
	"testing"
	"time"

	"github.com/compensa/compensa/saga"
)

// Epoch is a convenient start for a test clock: far from the wall clock, so
// that a journal reading the wall clock by mistake fails loudly.
var Epoch = time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)

// Harness is one fresh, empty journal under test and the clock it runs on.
type Harness struct {
	Journal saga.Journal
	// Clock is the journal's only clock.
	Clock *Clock
	// Peer returns another Journal over the same store, as a second process
	// would hold it (for PostgreSQL: its own connection pool). Nil means
	// Journal itself.
	Peer func(t *testing.T) saga.Journal
}

// Clock is a settable clock, safe for concurrent use. Its Now is what the
// journal under test reads.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock standing at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t (backwards too).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock forward by d and returns the new time.
func (c *Clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// PtrNow returns a pointer to the clock's time: the shape of pgjournal's
// Config.Now.
func (c *Clock) PtrNow() *time.Time {
	t := c.Now()
	return &t
}
