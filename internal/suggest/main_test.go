package suggest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
