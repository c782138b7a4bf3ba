package saga_test

import (
	"os"
	"testing"

	"github.com/compensa/compensa/test/pgtest"
)

// TestMain gives the package's tests one throwaway PostgreSQL (started on
// first use) and checks that no goroutine outlives them.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
