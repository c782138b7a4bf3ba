//go:build !failpoint

package failpoint

import "github.com/compensa/compensa/cdc"

// Wrap is a no-op without `-tags failpoint`: see failpoint.go.
func Wrap(sink cdc.Sink) cdc.Sink { return sink }
