package main

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/internal/suggest"
)

// The CLI is strict because scripts call it: a mistyped command, a stray
// argument or a bad flag value anywhere exits 2 with one line that names it
// and the closest valid choice, never with the parent's help and status 0.
// Flag values are checked once, when they are parsed (from the command line or
// the RELAY_* environment), by the value type each flag is declared with
// (internal/cliflag), so every part of the relay sees the same validated
// value.

// usageError is exit status 2: the command line itself is wrong.
func usageError(format string, args ...any) error {
	return exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

// harden makes the whole command tree strict: an unknown command, a stray
// or missing argument and every flag error exit 2 with one line. The flags'
// own rules are declared with the flags (internal/cliflag).
func harden(root *cobra.Command) {
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
					return unknownCommand(target, a)
				}
				target = next
			}
			return target.Help()
		},
	}
	root.SetHelpCommand(help)
	root.AddCommand(help)
	walk(root, func(c *cobra.Command) {
		// SuggestionsFor reads it as it is; cobra fills in its default
		// of 2 only on the way to its own message, which parentStrict
		// replaces.
		c.SuggestionsMinimumDistance = 2
		if c.HasSubCommands() && !c.Runnable() {
			parentStrict(c)
			return
		}
		leafStrict(c)
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
		return unknownCommand(c, args[0])
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

// unknownCommand is the error for a word that names no subcommand of c,
// with cobra's suggestions (its edit distance, or the word as a prefix), else
// every choice.
func unknownCommand(c *cobra.Command, word string) error {
	hint := "choose one of: " + strings.Join(subcommandNames(c), ", ")
	// An empty word is the prefix of every command: no suggestion.
	if near := c.SuggestionsFor(word); len(near) > 0 && word != "" {
		slices.Sort(near)
		near = slices.Compact(near)
		for i, w := range near {
			near[i] = strconv.Quote(w)
		}
		hint = "did you mean " + orList(near) + "?"
	}
	return usageError("unknown command %q for %q; %s", word, c.CommandPath(), hint)
}

// orList writes a, b or c.
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// flagError rewrites pflag's errors into one line naming the flag and, for
// a value, what the flag wants (its Set says it); every one exits 2.
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
		hint := "see " + c.CommandPath() + " --help"
		if near := suggest.Nearest(name, flagNames(c)); near != "" {
			hint = fmt.Sprintf("did you mean %q?", "--"+near)
		}
		return usageError("unknown flag --%s for %q; %s", name, c.CommandPath(), hint)
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return usageError("invalid value %q for --%s of %q: %s", invalid.GetValue(), f.Name, c.CommandPath(), refusal(f, invalid.Unwrap()))
	case errors.As(err, &required):
		f := required.GetFlag()
		want := "see --help"
		if v, ok := f.Value.(cliflag.Value); ok {
			want = v.Want()
		}
		return usageError("flag --%s of %q needs a value (%s)", f.Name, c.CommandPath(), want)
	}
	return usageError("%s for %q; see %s --help", err, c.CommandPath(), c.CommandPath())
}

// refusal says what a flag wants after its Set refused a value: a cliflag
// value says it itself, pflag's bool only in strconv's words.
func refusal(f *pflag.Flag, err error) string {
	if f.Value.Type() == "bool" {
		return "want true or false"
	}
	return err.Error()
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
