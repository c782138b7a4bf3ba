package main

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/compensa/compensa/outbox"
	"github.com/compensa/compensa/saga"
)

// The CLI is strict because scripts call it: a mistyped command, a stray
// argument or a bad flag value anywhere exits 2 with one line that names it
// and the closest valid choice, never with the parent's help and status 0.
// Flag values are checked once, when they are parsed (from the command line or
// the RELAY_* environment), so every part of the relay sees the same
// validated value.

// usageError is exit status 2: the command line itself is wrong.
func usageError(format string, args ...any) error {
	return exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

// sharedFlags are the flags several commands take, bound to rootOptions.
var sharedFlags = []string{"database-url", "slot", "publication", "http-addr", "outbox-table", "outbox-columns", "log-level"}

// sharedFlagsOf says which shared flags each command takes: a flag that means
// nothing to a command (--slot to `relay version`, --database-url to `relay
// demo`, which starts its own database) is not offered by it. A command that
// is not listed takes them all, so a new command works at once; list it here
// when it needs fewer (docs/cli/ is generated from the usage strings: a
// test checks it is current).
var sharedFlagsOf = map[string][]string{
	"relay version":           {},
	"relay help":              {},
	"relay migrate":           {"database-url", "slot", "publication", "outbox-table", "outbox-columns"},
	"relay lag":               {"database-url", "slot", "outbox-table", "outbox-columns"},
	"relay sagas list":        {"database-url"},
	"relay sagas show":        {"database-url"},
	"relay sagas retry":       {"database-url"},
	"relay sagas cancel":      {"database-url"},
	"relay sagas pause":       {"database-url"},
	"relay sagas resume":      {"database-url"},
	"relay sagas replay":      {"database-url"},
	"relay sagas upgrade":     {"database-url"},
	"relay sagas start":       {"database-url", "outbox-table"},
	"relay sagas validate":    {"database-url"},
	"relay sagas test":        {},
	"relay deadletters list":  {"database-url"},
	"relay deadletters retry": {"database-url", "outbox-table", "outbox-columns"},
	"relay sinks validate":    {},
	"relay sinks test":        {"database-url", "outbox-table"},
	"relay sinks list":        {"database-url"},
	"relay sinks retry":       {"database-url"},
	"relay sinks parked":      {"database-url"},
	"relay sinks skip":        {"database-url"},
	"relay sinks replay":      {"database-url", "outbox-table", "outbox-columns"},
	"relay demo":              {"http-addr", "log-level"},
}

// harden applies the rules above to the whole command tree: shared flags
// where they mean something, a check on every flag value, unknown commands
// and stray arguments as usage errors.
func harden(root *cobra.Command, opts *rootOptions) {
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(flagError)
	help := &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			target := root
			for _, a := range args {
				next := findSubcommand(target, a)
				if next == nil {
					return usageError("unknown command %q for %q; %s", a, target.CommandPath(), closest(a, subcommandNames(target), "", "choose one of"))
				}
				target = next
			}
			return target.Help()
		},
	}
	root.SetHelpCommand(help)
	root.AddCommand(help)
	walk(root, func(c *cobra.Command) {
		if c.HasSubCommands() && !c.Runnable() {
			parentStrict(c)
			return
		}
		names, listed := sharedFlagsOf[c.CommandPath()]
		if !listed {
			names = sharedFlags
		}
		opts.bindTo(c.Flags(), names)
		leafStrict(c)
	})
	walk(root, func(c *cobra.Command) {
		c.Flags().VisitAll(checkFlag)
		c.PersistentFlags().VisitAll(checkFlag)
	})
}

func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, sub := range c.Commands() {
		walk(sub, f)
	}
}

// parentStrict makes a command that only groups others refuse an unknown
// command (with the closest one) and being called alone.
func parentStrict(c *cobra.Command) {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[groupAnnotation] = "true"
	c.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		return usageError("unknown command %q for %q; %s", args[0], c.CommandPath(), closest(args[0], subcommandNames(c), "", "choose one of"))
	}
	c.RunE = func(c *cobra.Command, _ []string) error {
		return usageError("%q needs a command: one of %s (see %s --help)", c.CommandPath(), strings.Join(subcommandNames(c), ", "), c.CommandPath())
	}
}

// groupAnnotation marks a command that only groups others.
const groupAnnotation = "compensa.group"

func isGroup(c *cobra.Command) bool { return c.Annotations[groupAnnotation] != "" }

// leafStrict turns cobra's argument errors into usage errors that name the
// stray or missing argument and show the command's usage.
func leafStrict(c *cobra.Command) {
	check := c.Args
	if check == nil {
		check = cobra.NoArgs
	}
	c.Args = func(c *cobra.Command, args []string) error {
		if err := check(c, args); err != nil {
			least, most := acceptedArgs(c, check)
			switch {
			case most >= 0 && len(args) > most:
				return usageError("unexpected argument %q for %q; usage: %s", args[most], c.CommandPath(), c.UseLine())
			case least >= 0 && len(args) < least:
				return usageError("%q is missing an argument; usage: %s", c.CommandPath(), c.UseLine())
			}
			return usageError("%s; usage: %s", err, c.UseLine())
		}
		return nil
	}
}

// acceptedArgs finds the fewest and the most positional arguments check
// accepts among 0..4 (-1 when it accepts none of them; most is -1 when it
// also accepts 4, as for any number).
func acceptedArgs(c *cobra.Command, check cobra.PositionalArgs) (least, most int) {
	least, most = -1, -1
	for n := 0; n <= 4; n++ {
		if check(c, make([]string, n)) == nil {
			if least < 0 {
				least = n
			}
			most = n
		}
	}
	if most == 4 {
		most = -1
	}
	return least, most
}

func findSubcommand(c *cobra.Command, name string) *cobra.Command {
	for _, s := range c.Commands() {
		if s.Name() == name || s.HasAlias(name) {
			return s
		}
	}
	return nil
}

func subcommandNames(c *cobra.Command) []string {
	var names []string
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	sort.Strings(names)
	return names
}

// flagError rewrites pflag's errors into one line naming the flag and the
// closest valid choice; every one exits 2.
func flagError(c *cobra.Command, err error) error {
	var notExist *pflag.NotExistError
	var invalid *pflag.InvalidValueError
	var required *pflag.ValueRequiredError
	switch {
	case errors.As(err, &notExist):
		name := notExist.GetSpecifiedName()
		if name == "" {
			return usageError("unknown shorthand flag -%s for %q; see %s --help", notExist.GetSpecifiedShortnames(), c.CommandPath(), c.CommandPath())
		}
		return usageError("unknown flag --%s for %q; %s", name, c.CommandPath(), closest(name, flagNames(c), "--", "see "+c.CommandPath()+" --help"))
	case errors.As(err, &invalid):
		cause := invalid.Unwrap()
		var bad badValue
		if errors.As(cause, &bad) {
			return usageError("invalid value %q for --%s of %q: %s", invalid.GetValue(), invalid.GetFlag().Name, c.CommandPath(), bad.want)
		}
		return usageError("invalid value %q for --%s of %q: %s", invalid.GetValue(), invalid.GetFlag().Name, c.CommandPath(), wantFor(invalid.GetFlag()))
	case errors.As(err, &required):
		return usageError("flag --%s of %q needs a value (%s)", required.GetFlag().Name, c.CommandPath(), wantFor(required.GetFlag()))
	}
	return usageError("%s for %q; see %s --help", err, c.CommandPath(), c.CommandPath())
}

func flagNames(c *cobra.Command) []string {
	var names []string
	add := func(f *pflag.Flag) {
		if !f.Hidden && !slices.Contains(names, f.Name) {
			names = append(names, f.Name)
		}
	}
	c.Flags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	sort.Strings(names)
	return names
}

// closest proposes the valid choice nearest to got: "did you mean X?" when
// one is near enough, else the fallback (a list of choices, or a hint).
func closest(got string, choices []string, prefix, fallback string) string {
	best, bestD := "", 1<<30
	for _, c := range choices {
		d := editDistance(strings.ToLower(got), strings.ToLower(c))
		if strings.HasPrefix(c, got) && len(got) >= 2 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	if best != "" && bestD <= max(2, len(got)/3) {
		return fmt.Sprintf("did you mean %q?", prefix+best)
	}
	if fallback == "choose one of" {
		return "choose one of: " + strings.Join(choices, ", ")
	}
	return fallback
}

// editDistance is Levenshtein's distance, with a swap of two neighbouring
// letters counted as one edit ("lsit" → "list").
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range rb {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// badValue is a value a check refused, with what the flag wants.
type badValue struct{ want string }

func (b badValue) Error() string { return b.want }

// checkedValue checks a value before the flag takes it.
type checkedValue struct {
	pflag.Value
	check func(string) error
}

func (v *checkedValue) Set(s string) error {
	if err := v.check(s); err != nil {
		return err
	}
	return v.Value.Set(s)
}

// enumFlags are flags that take one of a few words, from the packages that
// own them.
var enumFlags = map[string][]string{
	"log-level": {"debug", "info", "warn", "error"},
	"status":    statusNames(),
}

func statusNames() []string {
	names := make([]string, len(saga.Statuses))
	for i, st := range saga.Statuses {
		names[i] = string(st)
	}
	return names
}

// stringChecks check free-text flags that still have a form.
var stringChecks = map[string]func(string) error{
	"outbox-table": func(s string) error {
		if _, err := outbox.ParseTableName(s); err != nil {
			return fmt.Errorf("want a table name such as outbox or events.outbox (%v)", err)
		}
		return nil
	},
	"outbox-columns": func(s string) error {
		if _, err := outbox.ParseColumnMap(s); err != nil {
			return fmt.Errorf("want field=column,... (%v)", strings.TrimPrefix(err.Error(), "--outbox-columns: "))
		}
		return nil
	},
	"http-addr": func(s string) error {
		_, port, err := net.SplitHostPort(s)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		if err != nil {
			return fmt.Errorf("want host:port such as 127.0.0.1:8080 or :8080")
		}
		return nil
	},
	"slot": func(s string) error {
		if !slotNameRE.MatchString(s) {
			return fmt.Errorf("want a replication slot name: 1 to 63 lower-case letters, digits or underscores")
		}
		return nil
	},
}

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// uuidFlags take a UUID.
var uuidFlags = map[string]bool{"tenant": true}

// zeroAllowed are numeric flags whose positive default still allows 0
// (for the retentions: keep forever).
var zeroAllowed = map[string]bool{"fail": true, "saga-retention": true, "dedupe-window": true}

// maxAnnotation marks a number flag with its largest accepted value (see
// setFlagMax).
const maxAnnotation = "compensa_max"

// setFlagMax bounds the number flag name of fs: a larger value is refused
// when the flag is parsed, exit 2, before any connection is made.
func setFlagMax(fs *pflag.FlagSet, name string, most int) {
	if err := fs.SetAnnotation(name, maxAnnotation, []string{strconv.Itoa(most)}); err != nil {
		panic(err)
	}
}

// flagMax is the largest value of a number flag, if it has one.
func flagMax(f *pflag.Flag) (int, bool) {
	v := f.Annotations[maxAnnotation]
	if len(v) != 1 {
		return 0, false
	}
	n, err := strconv.Atoi(v[0])
	return n, err == nil
}

// checkFlag installs the check of one flag, decided by its name and type: a
// number or a duration whose default is positive must be positive (0 is not
// "the default"), one whose default is 0 may be 0 (off), none may be
// negative; a word flag takes one of its words.
func checkFlag(f *pflag.Flag) {
	if _, done := f.Value.(*checkedValue); done || f.Name == "help" {
		return
	}
	check := valueCheck(f)
	if check != nil {
		f.Value = &checkedValue{Value: f.Value, check: check}
	}
}

func valueCheck(f *pflag.Flag) func(string) error {
	switch f.Value.Type() {
	case "int", "int32", "int64":
		def, _ := strconv.Atoi(f.DefValue)
		positive := def > 0 && !zeroAllowed[f.Name]
		most, bounded := flagMax(f)
		return func(s string) error {
			n, err := strconv.Atoi(s)
			switch {
			case err != nil, n < 0, positive && n < 1, bounded && n > most:
				return badValue{wantFor(f)}
			}
			return nil
		}
	case "duration":
		def, _ := time.ParseDuration(f.DefValue)
		positive := def > 0 && !zeroAllowed[f.Name]
		return func(s string) error {
			d, err := time.ParseDuration(s)
			switch {
			case err != nil, d < 0, positive && d == 0:
				return badValue{wantFor(f)}
			}
			return nil
		}
	case "bool":
		return func(s string) error {
			if _, err := strconv.ParseBool(s); err != nil {
				return badValue{wantFor(f)}
			}
			return nil
		}
	case "string":
		if words, ok := enumFlags[f.Name]; ok {
			return func(s string) error {
				if s == "" && f.DefValue == "" {
					return nil
				}
				if slices.Contains(words, s) {
					return nil
				}
				want := "want one of " + strings.Join(words, ", ")
				if hint := closest(s, words, "", ""); hint != "" {
					want += "; " + hint
				}
				return badValue{want}
			}
		}
		if check, ok := stringChecks[f.Name]; ok {
			return func(s string) error {
				if err := check(s); err != nil {
					return badValue{err.Error()}
				}
				return nil
			}
		}
		if uuidFlags[f.Name] {
			return func(s string) error {
				if s == "" {
					return nil
				}
				if _, err := uuid.Parse(s); err != nil {
					return badValue{"want a UUID"}
				}
				return nil
			}
		}
	}
	return nil
}

// wantFor says in words what a flag accepts.
func wantFor(f *pflag.Flag) string {
	switch f.Value.Type() {
	case "int", "int32", "int64":
		def, _ := strconv.Atoi(f.DefValue)
		least := 0
		if def > 0 && !zeroAllowed[f.Name] {
			least = 1
		}
		if most, ok := flagMax(f); ok {
			return fmt.Sprintf("want a whole number from %d to %d", least, most)
		}
		return fmt.Sprintf("want a whole number of at least %d", least)
	case "duration":
		def, _ := time.ParseDuration(f.DefValue)
		if def > 0 && zeroAllowed[f.Name] {
			return "want a duration such as 1h, 24h or 720h, or 0 to keep forever"
		}
		if def > 0 {
			return "want a positive duration such as 30s, 5m or 1h"
		}
		return "want a duration such as 30s, 5m or 24h, or 0 for off"
	case "bool":
		return "want true or false"
	}
	if words, ok := enumFlags[f.Name]; ok {
		return "want one of " + strings.Join(words, ", ")
	}
	return "see --help"
}
