package memjournal_test

import (
	"testing"

	"github.com/compensa/compensa/saga/journaltest"
	"github.com/compensa/compensa/saga/memjournal"
)

func TestConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) journaltest.Harness {
		clock := journaltest.NewClock(journaltest.Epoch)
		return journaltest.Harness{Journal: memjournal.New(clock.Now), Clock: clock}
	})
}
