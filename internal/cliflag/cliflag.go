// Package cliflag holds the typed flag values (pflag.Value) the relay's CLI
// declares its flags with: a word of a list, a bounded whole number, a
// duration, a UUID, a table name, a host:port, KEY=VALUE pairs. A flag's
// rule is written where the flag is declared, and its Set enforces it on
// every value, from the command line or a RELAY_* variable alike, so that
// the command runs only with values that passed.
//
// A refused value's error is one line saying what the flag wants ("want a
// whole number from 1 to 500"); the CLI names the flag and the command
// around it.
package cliflag

import "github.com/spf13/pflag"

// Value is a flag value that says what it accepts.
type Value interface {
	pflag.Value
	// Want says what the flag accepts, as "want ...".
	Want() string
}
